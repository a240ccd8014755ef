"""The torch.distributed backend of the emulated world: one real rank, every peer played by symmetry.

Registered with ``torch.distributed.Backend.register_backend`` under :data:`BACKEND`; every process
group megatron-core creates is an :class:`EmulatedGroup` (this process is rank ``world.rank`` of
``world.world_size``; groups without it are never created). What a collective returns follows from
a symmetric world, where every rank holds the same tokens and the same replicated weights and only
the experts it owns differ:

* all-reduce: SUM gives ``n`` times the input, PRODUCT its ``n``-th power; AVG, MAX, MIN and the
  bitwise ops leave it unchanged;
* all-gather replicates the input ``n`` times, except in place (the input is this rank's chunk of
  the output, as the distributed optimizer gathers its parameter shards): the other chunks already
  hold what the other ranks have, the replicated values, and stay; reduce-scatter returns this
  rank's chunk of the input summed over ``n`` identical ranks (AVG: the chunk);
* broadcast and barrier change nothing;
* all-to-all: from every peer, the rows its split size says, taken from the rows this rank sends to
  itself (a peer's rows for this rank are shaped like this rank's rows for itself). Where the
  output's chunks differ from that in size (a combine, whose chunks are what this rank sent each
  peer, and a dispatch's backward), the received rows hold this rank's own rows once, then zeros: one
  copy and one fill, where chunk-exact stand-in values took a copy of the split sizes and nine kernels.
  Output rows past the received ones are not written (NCCL writes none there either: a receive
  buffer of worst-case size keeps its padding).

Each collective runs where ProcessGroupNCCL runs one. A synchronous one (``async_op=False``, the
default: ``opts.asyncOp`` is false) goes on the issuing stream, as NCCL's does with ``asyncOp``
false (its current stream is its NCCL stream), and nothing is left to wait for. An asynchronous one
(the distributed optimizer's gradient reduce-scatter and parameter all-gather) goes on its group's
own stream, which first waits for the work the issuing stream has queued, and runs beside the
compute queued after it, as on a cluster; its work makes a waiting stream wait for it. Either way
the collective enqueues its copies, then holds ``comm_sms`` SMs of the GPU for the modeled time
(:mod:`hold`). A synchronous call thus costs the host no stream switch, event or cross-stream wait,
only its copies, its price and the hold's launch. Inside a CUDA-graph capture the same calls are
captured (stream waits, copies, the hold kernel) and the record charges them at each replay. Nothing
else is supported (point-to-point, gather, scatter, a premultiplied sum): those raise
:class:`EmulationUnsupported`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from megatron.bridge.emulation.hold import Hold
from megatron.bridge.emulation.network import Charge, GroupCosts, NetworkModel
from megatron.bridge.emulation.record import CommRecord, HostTimer

logger = logging.getLogger(__name__)

BACKEND = "megatron_bridge_emulated"
_UNCHANGED_OPS = (ReduceOp.AVG, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


class EmulationUnsupported(RuntimeError):
    """A collective the emulated world cannot give a meaningful result for."""


@dataclass
class EmulatedWorld:
    """The one real rank, the network it is charged for, and what it has done."""

    rank: int
    world_size: int
    network: NetworkModel
    record: CommRecord = field(default_factory=CommRecord)
    hold: Hold = field(default_factory=Hold)
    streams: dict[tuple[str, int], torch.cuda.Stream] = field(default_factory=dict)

    def stream(self, group: str, device: torch.device) -> torch.cuda.Stream:
        """The group's communication stream on ``device`` (one per group and device, as NCCL's)."""
        key = (group, device.index or 0)
        if key not in self.streams:
            self.streams[key] = torch.cuda.Stream(device=device)
        return self.streams[key]

    def charge(self, group: EmulatedGroup, kind: str, cost: Charge, on_gpu: bool) -> None:
        """Record a collective and, on a GPU, hold the current (the group's) stream for its modeled time,
        after the NIC is free where it crosses the NIC (issued inside a CUDA-graph capture, it is
        recorded at every replay instead)."""
        capturing = on_gpu and torch.cuda.is_current_stream_capturing()
        self.record.add(group.label, kind, cost.sent_bytes, cost.seconds, cost.inter_node_bytes, capturing=capturing)
        if cost.seconds > 0 and on_gpu:
            self.hold(
                cost.seconds, self.network.comm_sms, all_to_all=kind == "all_to_all", nic_seconds=cost.nic_seconds
            )

    def charge_rows(self, group: EmulatedGroup, kind: str, bytes_to_peer: list[int], on_gpu: bool) -> None:
        """Charge, on the current stream, one call that sends ``bytes_to_peer[j]`` to peer ``j`` over
        NVLink and NIC at once (sizes known on the host)."""
        with HostTimer(self.record):
            self.charge(group, kind, group.costs.all_to_all(bytes_to_peer), on_gpu)

    def charge_serial_exchange(self, group: EmulatedGroup, splits: torch.Tensor, row_bytes: int) -> None:
        """Charge, on the current stream, an exchange of ``splits[j]`` rows of ``row_bytes`` to peer
        ``j``, one call per peer in turn (``GroupCosts.serial_all_to_all``). On a GPU the split sizes
        never reach the host: the hold kernel prices and tallies the exchange itself."""
        with HostTimer(self.record):
            costs = group.costs
            if splits.is_cuda:
                tally = self.record.device_tally(group.label, "all_to_all", splits.device)
                if self.hold.serial_exchange(
                    splits,
                    row_bytes,
                    costs.device_tables(splits.device),
                    costs.barrier_seconds,
                    tally,
                    self.network.comm_sms,
                ):
                    return
            cost = costs.serial_all_to_all([rows * row_bytes for rows in splits.tolist()])
            self.charge(group, "all_to_all", cost, splits.is_cuda)


class _Done(dist.Work):
    """A collective already enqueued: waiting makes the current stream wait for its last kernel."""

    def __init__(self, event: torch.cuda.Event | None, result: Any = None) -> None:
        super().__init__()
        self.event, self.result_value = event, result

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)
        return True

    def is_completed(self) -> bool:
        return self.event is None or self.event.query()

    def is_success(self) -> bool:
        return True

    def result(self) -> Any:
        return self.result_value


_COMPLETED = _Done(None)
"""The work of every synchronous or CPU collective: enqueued where its caller's later work follows it,
so there is nothing to wait for (one object: the host makes none per call)."""


@dataclass(frozen=True, slots=True)
class _Issued:
    """Where a collective's GPU work went: ``stream``, the group's own stream (an asynchronous call), or
    ``None``, the issuing stream (a synchronous one)."""

    stream: torch.cuda.Stream | None


_ON_ISSUING_STREAM = _Issued(None)


class EmulatedGroup(dist.ProcessGroup):
    """One process group of the emulated world (this rank's view of it)."""

    def __init__(self, world: EmulatedWorld, rank: int, size: int, ranks: Sequence[int], name: str) -> None:
        super().__init__(rank, size)
        self.world, self.me, self.n = world, rank, size
        self.ranks = tuple(ranks) or tuple(range(size))
        self.name_ = name
        self._label: str | None = None
        self._costs: GroupCosts | None = None
        self._last_async: torch.cuda.Event | None = None
        """The end of this group's latest asynchronous collective (outside a graph capture): a synchronous
        one queues behind it, as NCCL runs a communicator's calls in the order they were issued,
        whatever their streams."""

    @property
    def label(self) -> str:
        """What the record calls this group: megatron-core's name once ``group_names.label_groups`` ran, else the
        description its creator gave ``new_group(group_desc=...)`` (set by torch after the group is
        made, so read at the first collective, then kept), else its number; with its size."""
        if self._label is None:
            desc = getattr(self, "group_desc", "undefined")
            base = desc if desc and desc != "undefined" else f"group{self.name_}"
            self._label = f"{base}[{len(self.ranks)}]"
        return self._label

    @label.setter
    def label(self, value: str) -> None:
        self._label = value

    @property
    def costs(self) -> GroupCosts:
        """The network model's answers for this group, for the network the world charges now: a
        process that trains several configs changes it between runs, and groups made once (the
        default group, a dispatcher's own) outlive a run."""
        if self._costs is None or self._costs.model is not self.world.network:
            self._costs = GroupCosts(self.world.network, self.ranks, self.me)
        return self._costs

    # ------------------------------------------------------------------------------- identity
    @property
    def group_name(self) -> str:
        return self.name_

    @property
    def pg_name(self) -> str:
        return self.name_

    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"EmulatedGroup({self.label}, rank {self.me} of {self.n})"

    # ------------------------------------------------------------------------------- collectives
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._all_reduce(tensors, opts)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._all_reduce(tensors, opts)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        with self._collective(opts, outputs, inputs) as issued:
            for outs, tensor in zip(outputs, inputs):
                for out in outs:
                    if out.data_ptr() != tensor.data_ptr():
                        out.copy_(tensor)
            return self._done("all_gather", sum(_nbytes(t) * self.n for t in inputs), issued)

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> dist.Work:
        with self._collective(opts, output, tensor) as issued:
            _replicate(output, tensor, self.n, self.me)
            return self._done("all_gather", _nbytes(output), issued)

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        with self._collective(opts, outputs, inputs) as issued:
            for output, tensor in zip(outputs, inputs):
                _replicate(output, tensor, self.n, self.me)
            return self._done("all_gather", sum(map(_nbytes, outputs)), issued)

    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _allgather_base = all_gather_single  # the name torch 2.11's all_gather_into_tensor calls

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> dist.Work:
        with self._collective(opts, output, tensor) as issued:
            self._own_chunk(output, tensor, opts.reduceOp)
            return self._done("reduce_scatter", _nbytes(tensor), issued)

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        with self._collective(opts, outputs, inputs) as issued:
            for output, tensor in zip(outputs, inputs):
                self._own_chunk(output, tensor, opts.reduceOp)
            return self._done("reduce_scatter", sum(map(_nbytes, inputs)), issued)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    _reduce_scatter_base = reduce_scatter_single  # the name torch 2.11's reduce_scatter_tensor calls

    def reduce_scatter(
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> dist.Work:
        with self._collective(opts, outputs, input_lists) as issued:
            for output, chunks in zip(outputs, input_lists):
                output.copy_(chunks[self.me])
                _reduce_identical(output, opts.reduceOp, self.n)
            return self._done("reduce_scatter", sum(_nbytes(c) for chunks in input_lists for c in chunks), issued)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> dist.Work:
        with self._collective(opts, output, tensor) as issued:
            sent = _exchange_rows(output, tensor, output_split_sizes, input_split_sizes, self.me, self.n)
            row = _nbytes(tensor) // max(1, tensor.shape[0]) if tensor.dim() else _nbytes(tensor)
            return self._all_to_all_charged([rows * row for rows in sent], issued)

    alltoall_base = all_to_all_single  # the name older torch's all_to_all_single calls

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        with self._collective(opts, outputs, inputs) as issued:
            own = inputs[self.me]
            for out in outputs:
                _copy_rows(out, own)
            return self._all_to_all_charged([_nbytes(t) for t in inputs], issued)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        with self._collective(opts, tensors) as issued:
            return self._done("broadcast", sum(map(_nbytes, tensors)), issued)

    def barrier(self, opts: Any = None) -> dist.Work:
        with self._collective(opts) as issued:
            return self._charged("barrier", self.costs.ring("barrier", 0), issued)

    # ------------------------------------------------------------------------------- refused
    def _refuse(self, what: str) -> None:
        raise EmulationUnsupported(
            f"{what} on {self.label}: the emulated world plays its peers by symmetry and cannot say what a "
            "peer would send point to point (pipeline or context parallelism); run those layouts on real GPUs"
        )

    def send(self, *args: Any, **kwargs: Any) -> dist.Work:
        self._refuse("send")

    def recv(self, *args: Any, **kwargs: Any) -> dist.Work:
        self._refuse("recv")

    def recv_anysource(self, *args: Any, **kwargs: Any) -> dist.Work:
        self._refuse("recv from any source")

    def gather(self, *args: Any, **kwargs: Any) -> dist.Work:
        self._refuse("gather")

    def scatter(self, *args: Any, **kwargs: Any) -> dist.Work:
        self._refuse("scatter")

    def reduce(self, *args: Any, **kwargs: Any) -> dist.Work:
        self._refuse("reduce")

    # ------------------------------------------------------------------------------- helpers
    def _all_reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        with self._collective(opts, tensors) as issued:
            for tensor in tensors:
                _reduce_identical(tensor, opts.reduceOp, self.n)
            return self._done("all_reduce", sum(map(_nbytes, tensors)), issued)

    @contextmanager
    def _collective(self, opts: Any, *tensors: Any) -> Iterator[_Issued | None]:
        """Time the host spends in the block and say where its GPU work goes (yielded): a synchronous
        call on the issuing stream; an asynchronous one on the group's stream, after what the issuing
        stream has queued (the tensors are marked as used there, for the caching allocator). On the
        CPU it yields ``None``."""
        with HostTimer(self.world.record):
            cuda = [t for t in _flat(tensors) if t.is_cuda]
            if not cuda:
                yield None
                return
            if not getattr(opts, "asyncOp", True):
                if self._last_async is not None and not torch.cuda.is_current_stream_capturing():
                    torch.cuda.current_stream(cuda[0].device).wait_event(self._last_async)
                yield _ON_ISSUING_STREAM
                return
            stream = self.world.stream(self.name_, cuda[0].device)
            stream.wait_stream(torch.cuda.current_stream(cuda[0].device))
            for tensor in cuda:
                tensor.record_stream(stream)
            with torch.cuda.stream(stream):
                yield _Issued(stream)

    def _own_chunk(self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp) -> None:
        output.view(-1).copy_(tensor.reshape(self.n, -1)[self.me])
        _reduce_identical(output, op, self.n)

    def _done(self, kind: str, nbytes: int, issued: _Issued | None) -> dist.Work:
        """Charge a ring collective on a tensor of ``nbytes`` (the record keeps the tensor's bytes)."""
        return self._charged(kind, self.costs.ring(kind, nbytes)._replace(sent_bytes=nbytes), issued)

    def _all_to_all_charged(self, to_peer: list[int], issued: _Issued | None) -> dist.Work:
        """Charge an all-to-all sending ``to_peer[j]`` bytes to peer ``j``."""
        return self._charged("all_to_all", self.costs.all_to_all(to_peer), issued)

    def _charged(self, kind: str, cost: Charge, issued: _Issued | None) -> dist.Work:
        self.world.charge(self, kind, cost, issued is not None)
        if issued is None or issued.stream is None:
            return _COMPLETED
        event = issued.stream.record_event()
        # an event of a CUDA-graph capture cannot be waited for outside it: a replay orders itself
        self._last_async = None if torch.cuda.is_current_stream_capturing() else event
        return _Done(event)


# ------------------------------------------------------------------------------------------- semantics
def _flat(items: Sequence[Any]) -> Iterator[torch.Tensor]:
    """The tensors of ``items`` (tensors, or lists of them, or lists of lists)."""
    for item in items:
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from _flat(item)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _reduce_identical(tensor: torch.Tensor, op: ReduceOp, n: int) -> None:
    """``tensor`` reduced with ``op`` over ``n`` ranks that all hold it."""
    if op == ReduceOp.SUM:
        tensor.mul_(n)
    elif op == ReduceOp.PRODUCT:
        tensor.pow_(n)
    elif not any(op == unchanged for unchanged in _UNCHANGED_OPS):
        raise EmulationUnsupported(
            f"all-reduce with {op}: only SUM, PRODUCT, AVG, MAX, MIN and bitwise ops are emulated"
        )


def _replicate(output: torch.Tensor, tensor: torch.Tensor, n: int, me: int) -> None:
    """Every chunk of ``output`` is ``tensor``; in place (``tensor`` is chunk ``me`` of ``output``)
    nothing moves: a symmetric world's other ranks hold the same values in their chunks already."""
    chunks = output.view(n, -1)
    if tensor.numel() and tensor.data_ptr() == chunks[me].data_ptr():
        return
    chunks.copy_(tensor.reshape(1, -1).expand(n, -1))


def _copy_rows(out: torch.Tensor, rows: torch.Tensor) -> None:
    """``out`` gets the first rows of ``rows`` (zeros where ``rows`` has fewer)."""
    k = min(out.shape[0], rows.shape[0]) if out.dim() else 0
    if not out.dim():
        out.copy_(rows)
        return
    out[:k].copy_(rows[:k])
    if k < out.shape[0]:
        out[k:].zero_()


def _exchange_rows(
    output: torch.Tensor, tensor: torch.Tensor, out_splits: list[int], in_splits: list[int], me: int, n: int
) -> list[int]:
    """Fill ``output`` as a symmetric all-to-all does; returns the rows this rank sends to each peer."""
    in_splits, out_splits = _sizes(in_splits), _sizes(out_splits)
    if not in_splits:
        rows = tensor.shape[0] // n
        own = tensor.narrow(0, me * rows, rows)
        output.view(n, *own.shape).copy_(own.unsqueeze(0).expand(n, *own.shape))
        return [rows] * n
    start = sum(in_splits[:me])
    own = tensor.narrow(0, start, in_splits[me])
    splits = out_splits or [output.shape[0] // n] * n
    received = sum(splits)  # rows past the received ones stay untouched, as NCCL leaves them
    target = output if received == output.shape[0] else output.narrow(0, 0, received)
    if all(s == in_splits[me] for s in splits):
        target.view(n, *own.shape).copy_(own.unsqueeze(0).expand(n, *own.shape))
        return list(in_splits)
    _copy_rows(target, own)
    return list(in_splits)


def _sizes(splits: Any) -> list[int]:
    """Split sizes as a list of ints (callers pass lists, tuples or numpy arrays; ``None``: equal)."""
    return [] if splits is None else [int(size) for size in splits]


# ------------------------------------------------------------------------------------------- the world
def _group_maker(world: EmulatedWorld) -> Callable[..., EmulatedGroup]:
    """The factory torch.distributed calls for every group it creates: groups of ``world``."""

    def make_group(opts: Any, backend_options: Any = None) -> EmulatedGroup:
        return EmulatedGroup(world, opts.group_rank, opts.group_size, list(opts.global_ranks_in_group), opts.group_id)

    return make_group


def _refuse_group(opts: Any, backend_options: Any = None) -> EmulatedGroup:
    raise EmulationUnsupported("the emulated backend was used before start_world() set up its world")


def _register(factory: Callable[..., EmulatedGroup]) -> None:
    """Make ``factory`` the one torch.distributed calls for :data:`BACKEND` (a later registration
    replaces an earlier one, so a stopped world's groups are never made again)."""
    dist.Backend.register_backend(BACKEND, factory, extended_api=True, devices=["cpu", "cuda"])


def start_world(rank: int, world_size: int, network: NetworkModel, timeout: timedelta) -> EmulatedWorld:
    """Register the backend for a new world and make it the default process group: this process is
    ``rank`` of ``world_size`` (no peer is contacted: the store is this process's own)."""
    world = EmulatedWorld(rank, world_size, network)
    _register(_group_maker(world))
    dist.init_process_group(BACKEND, rank=rank, world_size=world_size, store=dist.HashStore(), timeout=timeout)
    dist.group.WORLD.label = f"world[{world_size}]"
    return world


def stop_world() -> None:
    """The world is over (its default group destroyed): a group asked of the backend now is refused."""
    _register(_refuse_group)


def world_of_default_group() -> EmulatedWorld | None:
    """The emulated world whose group is this process's default group (``None``: none, or a real one)."""
    group = dist.group.WORLD if dist.is_initialized() else None
    return group.world if isinstance(group, EmulatedGroup) else None
