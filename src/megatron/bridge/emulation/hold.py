"""Keep SMs of the GPU busy for a modeled time, on the current stream, as a running NCCL kernel does.

An NCCL collective is a kernel: it occupies one thread block per channel on as many SMs, on the
stream the collective runs on, for as long as the transfer takes. :class:`Hold` launches a kernel
of ``sms`` blocks (512 threads each) whose threads spin on the GPU's global timer until the modeled
time has passed: kernels behind it on the same stream wait, kernels on other streams share the GPU
with it, and a CUDA graph captures it like any kernel. It is written in Triton; where Triton is
missing, ``torch.cuda._sleep`` (one thread, one SM, clock cycles) stands in and :attr:`Hold.kind`
says so.

:meth:`Hold.serial_exchange` is the device-side variant for an exchange whose split sizes never
reach the host (the sorted dispatcher's NVSHMEM transport, emulated): one kernel reads the split
sizes and the group's link table, works out the modeled time of one call per peer, adds the call to
a device-side tally, then holds as the plain kernel does.

The kernels are named as NCCL's are, so a profiler trace of an emulated step reads like a real one
(``scripts/performance/analyze_overlap.py`` counts ``emulated_nccl_all_to_all`` and
``emulated_nvshmem_all_to_all`` as dispatch/combine and ``emulated_nccl_collective`` as other
communication).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)

try:  # deferred-capable: Triton is optional (CPU machines have none)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = None


if triton is not None:

    @triton.jit
    def _spin_until(nanoseconds):
        start = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                          pack=1)
        now = start
        while now - start < nanoseconds:
            now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                            is_pure=False, pack=1)

    @triton.jit(do_not_specialize=["nanoseconds"])  # one compiled kernel for every time
    def emulated_nccl_all_to_all(nanoseconds):
        _spin_until(nanoseconds)

    @triton.jit(do_not_specialize=["nanoseconds"])
    def emulated_nccl_collective(nanoseconds):
        _spin_until(nanoseconds)

    @triton.jit(do_not_specialize=["row_bytes"])
    def emulated_nvshmem_all_to_all(splits_ptr, links_ptr, tally_ptr, world, row_bytes, BLOCK: tl.constexpr):
        """``links``: ``[4, world]`` float32 (latency ns, ns per byte, NIC flag, peer flag);
        ``tally``: int64 (calls, bytes to peers, bytes over the NIC, modeled ns)."""
        peers = tl.arange(0, BLOCK)
        mask = peers < world
        nbytes = tl.load(splits_ptr + peers, mask=mask, other=0).to(tl.int64) * row_bytes
        latency = tl.load(links_ptr + peers, mask=mask, other=0.0)
        ns_per_byte = tl.load(links_ptr + world + peers, mask=mask, other=0.0)
        nic = tl.load(links_ptr + 2 * world + peers, mask=mask, other=0.0)
        peer = tl.load(links_ptr + 3 * world + peers, mask=mask, other=0.0)
        nanoseconds = tl.sum(latency + nbytes.to(tl.float32) * ns_per_byte, axis=0).to(tl.int64)
        if tl.program_id(0) == 0:
            tl.atomic_add(tally_ptr, 1)
            tl.atomic_add(tally_ptr + 1, tl.sum(tl.where(peer > 0, nbytes, 0), axis=0))
            tl.atomic_add(tally_ptr + 2, tl.sum(tl.where(nic > 0, nbytes, 0), axis=0))
            tl.atomic_add(tally_ptr + 3, nanoseconds)
        _spin_until(nanoseconds)


class Hold:
    """``hold(seconds, sms, all_to_all)``: the current CUDA stream is busy on ``sms`` SMs for ``seconds``
    (in the kernel named for an all-to-all, or for any other collective)."""

    def __init__(self) -> None:
        self.kind: Optional[str] = None
        self._cycles_per_ns: Optional[float] = None

    def __call__(self, seconds: float, sms: int, all_to_all: bool = False) -> None:
        nanoseconds = int(seconds * 1e9)
        if nanoseconds <= 0:
            return
        if self.kind is None:
            self.kind = self._choose()
        if self.kind == "triton":
            kernel = emulated_nccl_all_to_all if all_to_all else emulated_nccl_collective
            kernel[(max(1, sms),)](nanoseconds, num_warps=16)
        else:
            torch.cuda._sleep(int(nanoseconds * self._clock_ghz()))

    def serial_exchange(self, splits: torch.Tensor, row_bytes: int, links: torch.Tensor, tally: torch.Tensor,
                        sms: int) -> bool:
        """Hold the current stream for an exchange of ``splits[j]`` rows of ``row_bytes`` to each peer
        ``j``, one peer after another over the links of ``links`` (``GroupCosts.link_table``), and add
        it to the device ``tally``, all on the GPU. ``False`` (nothing done) without the Triton
        kernel: the caller then charges from host split sizes."""
        if self.kind is None:
            self.kind = self._choose()
        if self.kind != "triton":
            return False
        world = splits.numel()
        emulated_nvshmem_all_to_all[(max(1, sms),)](splits, links, tally, world, row_bytes,
                                                     BLOCK=triton.next_power_of_2(world), num_warps=16)
        return True

    def _choose(self) -> str:
        if triton is None:
            logger.warning("Triton is not installed: modeled communication holds one SM (torch.cuda._sleep)")
            return "sleep"
        try:
            emulated_nccl_all_to_all[(1,)](1000, num_warps=16)
            emulated_nccl_collective[(1,)](1000, num_warps=16)
            return "triton"
        except Exception as exc:  # a Triton that cannot build the kernel on this GPU
            logger.warning("the Triton hold kernel failed (%s): modeled communication holds one SM", exc)
            return "sleep"

    def _clock_ghz(self) -> float:
        if self._cycles_per_ns is None:
            properties = torch.cuda.get_device_properties(torch.cuda.current_device())
            rate_khz = getattr(properties, "clock_rate", 0) or 1_500_000
            self._cycles_per_ns = rate_khz / 1e6
        return self._cycles_per_ns
