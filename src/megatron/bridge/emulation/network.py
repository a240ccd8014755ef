"""The network model: how long one collective takes, from its group, its bytes and the links it crosses.

Figures are *achievable* rates, each with its source in :data:`FIGURE_SOURCES`: what NCCL reaches on
the link, not its line rate (both are kept; the line rate is only reported). A collective costs a
latency plus its bytes over the bandwidth its algorithm gets:

* ring collectives (all-reduce ``2(n-1)/n`` of the tensor per GPU, all-gather and reduce-scatter
  ``(n-1)/n``, broadcast once): inside one node over NVLink; across nodes NCCL runs one ring per
  channel, spread over the NICs of the node, so the bus bandwidth is the smaller of NVLink's and the
  NICs of the group's GPUs in one node together;
* one all-to-all call: bytes to peers in the node over NVLink and to the others over this GPU's share
  of the node's NICs, at the same time;
* the sorted dispatcher's NVSHMEM exchange, one call per peer (:meth:`GroupCosts.serial_all_to_all`),
  ranks paired by XOR (``utils/pairwise_calls.py``): each call starts with a team-wide barrier, so it
  lasts as long as its slowest pair, and the calls run one after another.

Collectives that run at the same time and cross the NIC share it: the hold kernel keeps, on the GPU,
when the NIC is free again, and a collective that finds it busy sends after the one before it (first
come, first served). :func:`nic_queue_end` is that rule in plain Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from megatron.bridge.utils.pairwise_calls import call_peer

GB = 1e9


@dataclass(frozen=True)
class NetworkModel:
    """Figures of one kind of cluster (per GPU or per NIC, per direction, achievable)."""

    name: str
    gpus_per_node: int
    intra_node_gbps: float
    """NVLink bandwidth one GPU achieves, GB/s per direction."""
    inter_node_gbps: float
    """Bandwidth one NIC achieves between nodes, GB/s per direction."""
    intra_node_latency_us: float
    inter_node_latency_us: float
    nics_per_gpu: float = 1.0
    """NICs per GPU of a node (DGX H100: 8 for 8 GPUs); rings across nodes use every NIC of the node's
    GPUs in the group, an all-to-all gives each GPU its share."""
    comm_sms: int = 16
    """SMs a collective keeps busy while it runs (NCCL runs one thread block per channel, on
    Hopper up to 32 channels; 16 is assumed: set what NCCL_DEBUG=INFO reports on your cluster)."""
    intra_node_line_gbps: float | None = None
    """NVLink's line rate (reported beside the achievable rate; never used to price)."""
    inter_node_line_gbps: float | None = None
    """The NIC's line rate (reported only)."""
    source: str = ""

    @property
    def free(self) -> bool:
        return self.intra_node_gbps == float("inf") and self.inter_node_gbps == float("inf")

    def with_overrides(self, **figures: float | None) -> NetworkModel:
        """A copy with the given figures replaced (``None`` keeps the preset's)."""
        changes: dict[str, Any] = {k: v for k, v in figures.items() if v is not None}
        return dataclasses.replace(self, **changes)

    def figures(self) -> dict[str, Any]:
        """Every figure the model prices with, and its sources, as results record them."""
        return {**dataclasses.asdict(self), "nic_share_gbps": self.nic_share_gbps, "sources": dict(FIGURE_SOURCES)}

    # -------------------------------------------------------------------------------- links
    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def spans_nodes(self, ranks: Sequence[int]) -> bool:
        return len({self.node_of(r) for r in ranks}) > 1

    @property
    def nic_share_gbps(self) -> float:
        """The NIC bandwidth one GPU gets when every GPU of its node sends across nodes at once."""
        return self.inter_node_gbps * self.nics_per_gpu

    def ring_bandwidth(self, ranks: Sequence[int]) -> float:
        """Bus bandwidth, bytes/s, of a ring collective over ``ranks``: NVLink inside one node; across
        nodes the smaller of NVLink and the NICs of the group's GPUs in one node together."""
        if not self.spans_nodes(ranks):
            return self.intra_node_gbps * GB
        per_node = sum(1 for r in ranks if self.node_of(r) == self.node_of(ranks[0]))
        nvlink = self.intra_node_gbps if per_node > 1 else float("inf")
        return min(nvlink, per_node * self.nic_share_gbps) * GB

    def latency(self, ranks: Sequence[int]) -> float:
        """Seconds of latency of a collective over ``ranks`` (its slowest link's)."""
        return (self.inter_node_latency_us if self.spans_nodes(ranks) else self.intra_node_latency_us) * 1e-6

    # -------------------------------------------------------------------------------- collectives
    def seconds(self, kind: str, ranks: Sequence[int], nbytes: int) -> float:
        """Modeled time of a collective of ``kind`` over ``ranks`` on a tensor of ``nbytes``
        (all-gather: the output; reduce-scatter: the input; all-reduce and broadcast: the tensor)."""
        return GroupCosts(self, ranks, 0).ring(kind, nbytes).seconds

    def all_to_all_seconds(self, ranks: Sequence[int], me: int, bytes_to_peer: Sequence[int]) -> float:
        """Modeled time of an all-to-all in which this rank (``ranks[me]``) sends ``bytes_to_peer[j]``
        to ``ranks[j]`` (and, the world being symmetric, receives as much): NVLink and NIC at once."""
        return GroupCosts(self, ranks, me).all_to_all(bytes_to_peer).seconds

    def inter_node_bytes(self, kind: str, ranks: Sequence[int], nbytes: int) -> int:
        """Bytes each GPU of a ring collective sends over its NIC (none inside one node)."""
        return GroupCosts(self, ranks, 0).ring(kind, nbytes).inter_node_bytes


class Charge(NamedTuple):
    """What one collective costs: its modeled time alone, how much of it the NIC is busy, its bytes."""

    seconds: float
    nic_seconds: float
    sent_bytes: int
    inter_node_bytes: int


ALGORITHM_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}
"""Bytes each GPU moves per byte of the collective's tensor, for NCCL's ring algorithms."""

FIGURE_SOURCES: Mapping[str, str] = {
    "intra_node_gbps": "NVLink 4 achieves about 370 of its 450 GB/s per direction through NCCL (about 20 % protocol "
    "overhead; the bus bandwidth of NCCL_ALGO=Ring collectives on 8 H100 SXM: NVIDIA/nccl-tests#212, "
    "NVIDIA/nccl#1455: 365-370 GB/s)",
    "intra_node_line_gbps": "NVLink 4: 900 GB/s per GPU, both directions together (NVIDIA H100/H200 SXM datasheets)",
    "inter_node_gbps": "a 400 Gb/s NDR InfiniBand NIC achieves 46-48 GB/s through NCCL (NVIDIA/nccl-tests#290)",
    "inter_node_line_gbps": "400 Gb/s = 50 GB/s per direction (ConnectX-7 NDR)",
    "nics_per_gpu": "8 ConnectX-7 NICs per 8-GPU node, one per GPU (NVIDIA DGX H100/H200 system specifications); "
    "across nodes a ring's bus bandwidth is what goes through the node's NICs together (NVIDIA/nccl-tests#160)",
    "latency_us": "assumed figures for NCCL's small messages (5 us over NVLink, 15 us across nodes)",
    "comm_sms": "assumed: 16 channels (NCCL runs one thread block per channel)",
}
"""Where each preset figure comes from."""

_HOPPER: dict[str, Any] = dict(
    gpus_per_node=8,
    intra_node_gbps=370.0,
    inter_node_gbps=47.0,
    intra_node_latency_us=5.0,
    inter_node_latency_us=15.0,
    nics_per_gpu=1.0,
    intra_node_line_gbps=450.0,
    inter_node_line_gbps=50.0,
    source="DGX H100/H200-class nodes: 8 GPUs on NVLink 4, 8 NDR 400 Gb/s NICs; achievable rates, "
    "each figure's source in FIGURE_SOURCES",
)

PRESETS: Mapping[str, NetworkModel] = {
    "h100_ib400": NetworkModel("h100_ib400", **_HOPPER),
    "h200_ib400": NetworkModel("h200_ib400", **_HOPPER),
    "gb200_nvl72": NetworkModel(
        "gb200_nvl72",
        72,
        740.0,
        47.0,
        5.0,
        15.0,
        nics_per_gpu=1.0,
        intra_node_line_gbps=900.0,
        inter_node_line_gbps=50.0,
        source="NVLink 5: 1.8 TB/s per GPU, both directions, 72 GPUs in one NVLink domain (NVIDIA GB200 NVL72 "
        "specifications), taken at NVLink 4's achievable share (about 82 %); a 400 Gb/s NIC per GPU between racks "
        "at the achievable 47 GB/s; latencies assumed as for Hopper",
    ),
    "free": NetworkModel(
        "free", 8, float("inf"), float("inf"), 0.0, 0.0, comm_sms=0, source="no cost at all: the compute-only reference"
    ),
}
"""Named clusters; every figure can be overridden (``emulation.*`` settings)."""


def network_model(name: str, **overrides: float | None) -> NetworkModel:
    """The preset ``name`` with ``overrides`` (a ``KeyError`` names the presets)."""
    if name not in PRESETS:
        raise KeyError(f"unknown network {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name].with_overrides(**overrides)


def nic_queue_end(now_ns: int, seconds: float, nic_seconds: float, nic_free_ns: int) -> tuple[int, int]:
    """(when a collective issued at ``now_ns`` ends, when the NIC is free again): first come, first
    served. One that does not cross the NIC ends ``seconds`` later; one that does starts when the
    NIC is free (``nic_free_ns``, or now) and keeps it for ``nic_seconds``. The hold kernel does the
    same on the GPU, with its global timer."""
    duration, busy = round(seconds * 1e9), round(nic_seconds * 1e9)
    if busy <= 0:
        return now_ns + duration, nic_free_ns
    start = max(now_ns, nic_free_ns)
    return start + duration, start + busy


class GroupCosts:
    """The network model's answers for one group, seen from one of its ranks, with what depends only
    on the group's ranks (its ring bandwidth, which peers share this rank's node) worked out once:
    the backend asks for every collective it runs."""

    __slots__ = ("model", "ranks", "me", "_latency", "_ring_bandwidth", "_peer_in_node", "_spans", "_tables")

    def __init__(self, model: NetworkModel, ranks: Sequence[int], me: int) -> None:
        self.model, self.ranks, self.me = model, tuple(ranks), me
        self._spans = model.spans_nodes(self.ranks)
        single = len(self.ranks) <= 1
        self._latency = 0.0 if single else model.latency(self.ranks)
        self._ring_bandwidth = 1.0 if single else model.ring_bandwidth(self.ranks)
        node = model.node_of(self.ranks[me]) if self.ranks else 0
        self._peer_in_node = tuple(model.node_of(r) == node for r in self.ranks)
        self._tables: dict[Any, Any] = {}

    def ring(self, kind: str, nbytes: int) -> Charge:
        """A ring collective of ``kind`` on a tensor of ``nbytes``: latency plus the bytes each GPU
        moves over the ring's bus bandwidth; across nodes the whole transfer keeps the NICs busy."""
        n = len(self.ranks)
        if n <= 1:
            return Charge(0.0, 0.0, 0, 0)
        moved = ALGORITHM_FACTORS[kind](n) * nbytes
        inter = round(moved) if self._spans else 0
        if self.model.free:
            return Charge(0.0, 0.0, round(moved), inter)
        transfer = moved / self._ring_bandwidth
        return Charge(self._latency + transfer, transfer if self._spans else 0.0, round(moved), inter)

    def all_to_all_link_bytes(self, bytes_to_peer: Sequence[int]) -> tuple[int, int]:
        """(bytes to peers in this rank's node, bytes to peers in other nodes) of an all-to-all."""
        intra = inter = 0
        for j, (nbytes, in_node) in enumerate(zip(bytes_to_peer, self._peer_in_node)):
            if j == self.me:
                continue
            if in_node:
                intra += nbytes
            else:
                inter += nbytes
        return intra, inter

    def all_to_all(self, bytes_to_peer: Sequence[int]) -> Charge:
        """One all-to-all call sending ``bytes_to_peer[j]`` to peer ``j``: NVLink and this GPU's share of
        the node's NICs at once."""
        intra, inter = self.all_to_all_link_bytes(bytes_to_peer)
        m = self.model
        if len(self.ranks) <= 1 or m.free:
            return Charge(0.0, 0.0, intra + inter, inter)
        nvlink = m.intra_node_latency_us * 1e-6 + intra / (m.intra_node_gbps * GB) if intra else 0.0
        nic = inter / (m.nic_share_gbps * GB) if inter else 0.0
        seconds = max(nvlink, m.inter_node_latency_us * 1e-6 + nic if inter else 0.0)
        return Charge(seconds, nic, intra + inter, inter)

    def pair_link(self, source: int, dest: int) -> tuple[float, float, bool]:
        """(latency ns, ns per byte, whether it crosses nodes) of group ranks ``source`` -> ``dest``."""
        m = self.model
        cross = m.node_of(self.ranks[source]) != m.node_of(self.ranks[dest])
        latency_us = m.inter_node_latency_us if cross else m.intra_node_latency_us
        return latency_us * 1e3, 1.0 / (m.nic_share_gbps if cross else m.intra_node_gbps), cross

    def serial_calls(self) -> list[list[tuple[float, float, bool]]]:
        """``[k][j]``: the link of the pair that sends to ``j`` in call ``k`` (from ``j ^ k``), for
        ``k`` = 1 .. n-1: in call ``k`` every rank swaps rows with rank ``rank ^ k``."""
        n = len(self.ranks)
        return [[self.pair_link(call_peer(j, k, n), j) for j in range(n)] for k in range(1, n)]

    def serial_all_to_all(self, bytes_to_peer: Sequence[int]) -> Charge:
        """The exchange of one call per peer (the sorted dispatcher's NVSHMEM transport): in call ``k``
        every rank swaps rows with rank ``rank ^ k`` (:func:`call_peer`), and, the world being symmetric,
        rank ``j`` gets what this rank sends to ``j``. Each call starts with a team-wide barrier (the
        group's latency), then lasts as long as its slowest pair; the calls run one after another. This
        rank's own rows cross no link."""
        n = len(self.ranks)
        sent = sum(b for j, b in enumerate(bytes_to_peer) if j != self.me)
        inter = sum(b for j, b in enumerate(bytes_to_peer) if j != self.me and not self._peer_in_node[j])
        if n <= 1 or self.model.free:
            return Charge(0.0, 0.0, sent, inter)
        nanoseconds = nic_ns = 0.0
        for call in self.serial_calls():
            slowest, cross = max(
                (latency + bytes_to_peer[j] * per_byte, crosses) for j, (latency, per_byte, crosses) in enumerate(call)
            )
            nanoseconds += self._latency * 1e9 + slowest
            nic_ns += slowest if cross else 0.0
        return Charge(nanoseconds * 1e-9, nic_ns * 1e-9, sent, inter)

    @property
    def barrier_seconds(self) -> float:
        """The team-wide barrier each call of the serial exchange starts with (the group's latency)."""
        return 0.0 if self.model.free else self._latency

    def device_tables(self, device: Any) -> tuple[Any, Any]:
        """What the device-side charge of :meth:`serial_all_to_all` reads, made once per device, float32:
        ``calls[3, n, n]`` (latency ns, ns per byte, crosses nodes) of the pair that sends to rank ``j``
        in call ``k`` (row ``k = 0`` is no call and stays zero), and ``own[2, n]``: whether this rank's
        bytes to ``j`` go to a peer, and whether they cross the NIC."""
        if device not in self._tables:
            import torch  # deferred: the network model itself is plain Python (validation imports it)

            n = len(self.ranks)
            calls = torch.zeros(3, n, n, dtype=torch.float32)
            if not self.model.free and n > 1:
                for k, call in enumerate(self.serial_calls(), start=1):
                    calls[:, k] = torch.tensor(call, dtype=torch.float32).t()
            own = torch.tensor(
                [
                    [float(j != self.me) for j in range(n)],
                    [float(j != self.me and not self._peer_in_node[j]) for j in range(n)],
                ]
            )
            self._tables[device] = (calls.contiguous().to(device), own.contiguous().to(device))
        return self._tables[device]
