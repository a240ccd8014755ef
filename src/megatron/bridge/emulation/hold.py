"""Keep SMs of the GPU busy for a modeled time, on the current stream, as a running NCCL kernel does.

An NCCL collective is a kernel: it occupies one thread block per channel on as many SMs, on the
stream the collective runs on, for as long as the transfer takes. :class:`Hold` launches a kernel
of ``sms`` blocks (512 threads each) whose threads spin on the GPU's global timer until the modeled
time has passed: kernels behind it on the same stream wait, kernels on other streams share the GPU
with it, and a CUDA graph captures it like any kernel. Collectives that cross the NIC book it in a
device-side ledger (when the NIC is free again): one that finds it busy waits for it, first come,
first served, so collectives running at the same time on different streams share the NIC. It is
written in Triton; where Triton is missing, ``torch.cuda._sleep`` (one thread, one SM, clock cycles,
no NIC ledger) stands in and :attr:`Hold.kind` says so.

A hold is launched once per emulated collective (thousands a step), so its host cost is part of every
emulated step. Triton's ``kernel[grid](...)`` binds, specialises and looks up the compiled kernel at
every call; :class:`_DirectLaunch` compiles each hold kernel once (64-bit times, any grid) and then
calls Triton's compiled launcher itself, on the current stream. It is checked once, at the first hold,
against the GPU's timer; where it fails (a Triton whose launcher differs), or where that first hold is
inside a CUDA-graph capture (the check waits for the GPU), Triton's own launch is used and
:attr:`Hold.kind` says ``triton`` instead of ``triton-direct``.

:meth:`Hold.serial_exchange` is the device-side variant for an exchange whose split sizes never
reach the host (the sorted dispatcher's NVSHMEM transport, emulated): one kernel reads the split
sizes and the group's link tables, works out the modeled time of one call per peer (each as long as
its slowest pair), adds the exchange to a device-side tally, then holds as the plain kernel does.

The kernels are named as NCCL's are, so a profiler trace of an emulated step reads like a real one
(``scripts/performance/analyze_overlap.py`` counts ``emulated_nccl_all_to_all`` and
``emulated_nvshmem_all_to_all`` as dispatch/combine and ``emulated_nccl_collective`` as other
communication).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

try:  # deferred-capable: Triton is optional (CPU machines have none)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = None


if triton is not None:

    @triton.jit
    def _now():
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)

    @triton.jit
    def _spin_to(end):
        now = _now()
        while now < end:
            now = _now()

    @triton.jit
    def _end_after_nic(start, nanoseconds, nic_ns, ledger_ptr):
        """When a collective issued at ``start`` ends: ``nanoseconds`` later, or, when it keeps the NIC
        busy for ``nic_ns`` and the NIC is still busy (``ledger``: when it is free), that long after the
        NIC is free for it (first come, first served; ``network.nic_queue_end``). Block 0 books the NIC;
        the other blocks hold their SMs for the collective's own time."""
        end = start + nanoseconds
        if (nic_ns > 0) & (tl.program_id(0) == 0):
            tl.atomic_max(ledger_ptr, start)
            slot = tl.atomic_add(ledger_ptr, nic_ns)
            end = slot + nanoseconds
        return end

    @triton.jit(do_not_specialize=["nanoseconds", "nic_ns"])  # one compiled kernel for every time
    def emulated_nccl_all_to_all(nanoseconds, nic_ns, ledger_ptr):
        _spin_to(_end_after_nic(_now(), nanoseconds, nic_ns, ledger_ptr))

    @triton.jit(do_not_specialize=["nanoseconds", "nic_ns"])
    def emulated_nccl_collective(nanoseconds, nic_ns, ledger_ptr):
        _spin_to(_end_after_nic(_now(), nanoseconds, nic_ns, ledger_ptr))

    @triton.jit(do_not_specialize=["row_bytes", "barrier_ns"])
    def emulated_nvshmem_all_to_all(
        splits_ptr, calls_ptr, own_ptr, tally_ptr, ledger_ptr, world, row_bytes, barrier_ns, BLOCK: tl.constexpr
    ):
        """``calls``: ``[3, world, world]`` float32 (latency ns, ns per byte, crosses nodes) of the pair
        sending to rank ``j`` in call ``k``; ``own``: ``[2, world]`` (peer flag, NIC flag) of this rank's
        bytes to ``j``; ``tally``: int64 (calls, bytes to peers, bytes over the NIC, modeled ns). Each call
        lasts the barrier plus its slowest pair (``GroupCosts.serial_all_to_all``)."""
        start = _now()
        index = tl.arange(0, BLOCK)
        ks, js = index[:, None], index[None, :]
        inside = (ks < world) & (js < world)
        cells = world * world
        nbytes = tl.load(splits_ptr + js, mask=js < world, other=0).to(tl.int64) * row_bytes
        latency = tl.load(calls_ptr + ks * world + js, mask=inside, other=0.0)
        ns_per_byte = tl.load(calls_ptr + cells + ks * world + js, mask=inside, other=0.0)
        crosses = tl.load(calls_ptr + 2 * cells + ks * world + js, mask=inside, other=0.0)
        cost = tl.where(inside & (ks > 0), latency + nbytes.to(tl.float32) * ns_per_byte, 0.0)
        slowest = tl.max(cost, axis=1)
        slowest_crossing = tl.max(tl.where(crosses > 0, cost, 0.0), axis=1)
        is_call = (index > 0) & (index < world)
        nanoseconds = tl.sum(tl.where(is_call, slowest + barrier_ns, 0.0), axis=0).to(tl.int64)
        nic_ns = tl.sum(tl.where(is_call & (slowest_crossing >= slowest), slowest, 0.0), axis=0).to(tl.int64)
        if tl.program_id(0) == 0:
            mine = tl.load(splits_ptr + index, mask=index < world, other=0).to(tl.int64) * row_bytes
            peer = tl.load(own_ptr + index, mask=index < world, other=0.0)
            nic = tl.load(own_ptr + world + index, mask=index < world, other=0.0)
            tl.atomic_add(tally_ptr, 1)
            tl.atomic_add(tally_ptr + 1, tl.sum(tl.where(peer > 0, mine, 0), axis=0))
            tl.atomic_add(tally_ptr + 2, tl.sum(tl.where(nic > 0, mine, 0), axis=0))
            tl.atomic_add(tally_ptr + 3, nanoseconds)
        _spin_to(_end_after_nic(start, nanoseconds, nic_ns, ledger_ptr))


class _DirectLaunch:
    """One hold kernel, compiled once for 64-bit times, launched through Triton's compiled launcher on
    the current CUDA stream of ``ledger``'s GPU (no per-call binding or cache lookup)."""

    def __init__(self, kernel: object, ledger: torch.Tensor) -> None:
        # times past 2**31 ns make Triton type them int64: the one signature every hold then uses
        with torch.cuda.device(ledger.device):
            compiled = kernel.warmup(2**40, 2**40, ledger, grid=(1,), num_warps=16)  # type: ignore[attr-defined]
            self._launch = compiled.run
        self._function, self._metadata = compiled.function, compiled.packed_metadata
        self._ledger, self._device = ledger, ledger.device.index or 0
        self._current_stream = torch._C._cuda_getCurrentRawStream

    def __call__(self, sms: int, nanoseconds: int, nic_ns: int) -> None:
        stream = self._current_stream(self._device)
        self._launch(
            sms, 1, 1, stream, self._function, self._metadata, None, None, None, nanoseconds, nic_ns, self._ledger
        )


class Hold:
    """``hold(seconds, sms, all_to_all, nic_seconds)``: the current CUDA stream is busy on ``sms`` SMs for
    ``seconds`` (in the kernel named for an all-to-all, or for any other collective), after the NIC is
    free when the collective keeps it busy for ``nic_seconds`` (:func:`network.nic_queue_end`)."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self._cycles_per_ns: float | None = None
        self._ledgers: dict[torch.device, torch.Tensor] = {}
        self._direct: dict[tuple[int, bool], _DirectLaunch] = {}

    def nic_ledger(self, device: torch.device) -> torch.Tensor:
        """When this GPU's NIC is free again (global timer ns, int64 on ``device``), shared by every
        collective the GPU holds for."""
        ledger = self._ledgers.get(device)
        if ledger is None:
            ledger = self._ledgers[device] = torch.zeros(1, dtype=torch.int64, device=device)
        return ledger

    def __call__(self, seconds: float, sms: int, all_to_all: bool = False, nic_seconds: float = 0.0) -> None:
        nanoseconds = int(seconds * 1e9)
        if nanoseconds <= 0:
            return
        if self.kind is None:
            self.kind = self._choose()
        if self.kind == "triton-direct":
            self._direct_launch(all_to_all)(max(1, sms), nanoseconds, int(nic_seconds * 1e9))
        elif self.kind == "triton":
            kernel = emulated_nccl_all_to_all if all_to_all else emulated_nccl_collective
            ledger = self.nic_ledger(torch.device("cuda", torch.cuda.current_device()))
            kernel[(max(1, sms),)](nanoseconds, int(nic_seconds * 1e9), ledger, num_warps=16)
        else:
            torch.cuda._sleep(int(nanoseconds * self._clock_ghz()))

    def _direct_launch(self, all_to_all: bool) -> _DirectLaunch:
        """The current GPU's direct launcher of the all-to-all or the collective kernel (made at its first use)."""
        index = torch.cuda.current_device()
        launch = self._direct.get((index, all_to_all))
        if launch is None:
            self._make_direct(torch.device("cuda", index))
            launch = self._direct[index, all_to_all]
        return launch

    def serial_exchange(
        self,
        splits: torch.Tensor,
        row_bytes: int,
        tables: tuple[torch.Tensor, torch.Tensor],
        barrier_seconds: float,
        tally: torch.Tensor,
        sms: int,
    ) -> bool:
        """Hold the current stream for an exchange of ``splits[j]`` rows of ``row_bytes`` to each peer
        ``j``, one call per peer, each as long as its slowest pair over the links of ``tables``
        (``GroupCosts.device_tables``) after a barrier of ``barrier_seconds``, and add it to the device
        ``tally``, all on the GPU. ``False`` (nothing done) without the Triton kernel: the caller then
        charges from host split sizes."""
        if self.kind is None:
            self.kind = self._choose()
        if not self.kind.startswith("triton"):
            return False
        world = splits.numel()
        calls, own = tables
        emulated_nvshmem_all_to_all[(max(1, sms),)](
            splits,
            calls,
            own,
            tally,
            self.nic_ledger(splits.device),
            world,
            row_bytes,
            barrier_seconds * 1e9,
            BLOCK=triton.next_power_of_2(world),
            num_warps=16,
        )
        return True

    def _choose(self) -> str:
        if triton is None:
            logger.warning("Triton is not installed: modeled communication holds one SM (torch.cuda._sleep)")
            return "sleep"
        try:
            ledger = self.nic_ledger(torch.device("cuda", torch.cuda.current_device()))
            emulated_nccl_all_to_all[(1,)](1000, 0, ledger, num_warps=16)
            emulated_nccl_collective[(1,)](1000, 0, ledger, num_warps=16)
        except Exception as exc:  # a Triton that cannot build the kernel on this GPU
            logger.warning("the Triton hold kernel failed (%s): modeled communication holds one SM", exc)
            return "sleep"
        if torch.cuda.is_current_stream_capturing():  # the check below waits for the GPU: not in a capture
            return "triton"
        try:
            self._make_direct(ledger.device)
            self._check_direct(ledger)
            return "triton-direct"
        except Exception as exc:  # a Triton whose compiled launcher is called differently
            self._direct.clear()
            logger.warning("the direct launch of the hold kernel failed (%s): Triton's own launch is used", exc)
            return "triton"

    def _make_direct(self, device: torch.device) -> None:
        ledger = self.nic_ledger(device)
        for all_to_all, kernel in ((True, emulated_nccl_all_to_all), (False, emulated_nccl_collective)):
            self._direct[device.index or 0, all_to_all] = _DirectLaunch(kernel, ledger)

    def _check_direct(self, ledger: torch.Tensor, seconds: float = 2e-3) -> None:
        """Raise unless a direct launch holds the current stream for the time it is given."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._direct[ledger.device.index or 0, True](1, int(seconds * 1e9), 0)
        end.record()
        end.synchronize()
        held = start.elapsed_time(end) * 1e-3
        if not 0.9 * seconds <= held < 10 * seconds:
            raise RuntimeError(f"held the stream {held * 1e3:.3f} ms for a {seconds * 1e3:.0f} ms hold")

    def _clock_ghz(self) -> float:
        if self._cycles_per_ns is None:
            properties = torch.cuda.get_device_properties(torch.cuda.current_device())
            rate_khz = getattr(properties, "clock_rate", 0) or 1_500_000
            self._cycles_per_ns = rate_khz / 1e6
        return self._cycles_per_ns
