"""The network model: how long one collective takes, from its group, its bytes and the links it crosses.

A collective costs a latency plus its bytes over the slowest link it uses: NVLink between GPUs of
one node, the GPU's own NIC (InfiniBand or RoCE) between nodes. The bytes each GPU moves follow the
algorithm NCCL runs: a ring all-reduce sends ``2(n-1)/n`` of the tensor, all-gather and
reduce-scatter ``(n-1)/n`` of the whole, broadcast the tensor once, and an all-to-all what its split
sizes say, to peers in the node over NVLink and to the others over the NIC at the same time.

Bandwidths are the documented line rates per direction (what NCCL reaches is lower: 80-90 % is
usual), so modeled times are a lower bound for the hardware named. Every figure can be overridden.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

GB = 1e9


@dataclass(frozen=True)
class NetworkModel:
    """Figures of one kind of cluster (per GPU, per direction)."""

    name: str
    gpus_per_node: int
    intra_node_gbps: float
    """NVLink bandwidth of one GPU, GB/s per direction."""
    inter_node_gbps: float
    """The GPU's NIC bandwidth between nodes, GB/s per direction."""
    intra_node_latency_us: float
    inter_node_latency_us: float
    comm_sms: int = 16
    """SMs a collective keeps busy while it runs (NCCL runs one thread block per channel, on
    Hopper up to 32 channels; 16 is assumed: set what NCCL_DEBUG=INFO reports on your cluster)."""
    source: str = ""

    @property
    def free(self) -> bool:
        return self.intra_node_gbps == float("inf") and self.inter_node_gbps == float("inf")

    def with_overrides(self, **figures: Optional[float]) -> "NetworkModel":
        """A copy with the given figures replaced (``None`` keeps the preset's)."""
        return dataclasses.replace(self, **{k: v for k, v in figures.items() if v is not None})

    # -------------------------------------------------------------------------------- collectives
    def spans_nodes(self, ranks: Sequence[int]) -> bool:
        return len({r // self.gpus_per_node for r in ranks}) > 1

    def _link(self, ranks: Sequence[int]) -> tuple[float, float]:
        """(seconds of latency, bytes per second) of the slowest link the group's ring crosses."""
        if self.spans_nodes(ranks):
            return self.inter_node_latency_us * 1e-6, self.inter_node_gbps * GB
        return self.intra_node_latency_us * 1e-6, self.intra_node_gbps * GB

    def seconds(self, kind: str, ranks: Sequence[int], nbytes: int) -> float:
        """Modeled time of a collective of ``kind`` over ``ranks`` on a tensor of ``nbytes``
        (all-gather: the output; reduce-scatter: the input; all-reduce and broadcast: the tensor)."""
        return GroupCosts(self, ranks, 0).ring(kind, nbytes)[0]

    def all_to_all_seconds(self, ranks: Sequence[int], me: int, bytes_to_peer: Sequence[int]) -> float:
        """Modeled time of an all-to-all in which this rank (``ranks[me]``) sends ``bytes_to_peer[j]``
        to ``ranks[j]`` (and, the world being symmetric, receives as much): NVLink and NIC at once."""
        return self.all_to_all_time(ranks, *self.all_to_all_link_bytes(ranks, me, bytes_to_peer))

    def all_to_all_link_bytes(self, ranks: Sequence[int], me: int, bytes_to_peer: Sequence[int]) -> tuple[int, int]:
        """(bytes to peers in this rank's node, bytes to peers in other nodes) of an all-to-all."""
        return GroupCosts(self, ranks, me).all_to_all_link_bytes(bytes_to_peer)

    def all_to_all_time(self, ranks: Sequence[int], intra: int, inter: int) -> float:
        """Modeled time of an all-to-all that sends ``intra`` bytes over NVLink and ``inter`` over the NIC."""
        if len(ranks) <= 1 or self.free:
            return 0.0
        times = [0.0]
        if intra:
            times.append(self.intra_node_latency_us * 1e-6 + intra / (self.intra_node_gbps * GB))
        if inter:
            times.append(self.inter_node_latency_us * 1e-6 + inter / (self.inter_node_gbps * GB))
        return max(times)

    def inter_node_bytes(self, kind: str, ranks: Sequence[int], nbytes: int) -> int:
        """Bytes each GPU of a ring collective sends over its NIC (none inside one node)."""
        return GroupCosts(self, ranks, 0).ring(kind, nbytes)[1]


ALGORITHM_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}
"""Bytes each GPU moves per byte of the collective's tensor, for NCCL's ring algorithms."""

_HOPPER_SOURCES = (
    "NVLink 4: 900 GB/s per GPU, both directions together (NVIDIA H100 and H200 SXM datasheets); one "
    "ConnectX-7 400 Gb/s NIC per GPU and 8 GPUs per node (NVIDIA DGX H100/H200 system specifications); "
    "latencies are assumed figures for NCCL's small messages"
)

PRESETS: Mapping[str, NetworkModel] = {
    "h100_ib400": NetworkModel("h100_ib400", 8, 450.0, 50.0, 5.0, 15.0, source=_HOPPER_SOURCES),
    "h200_ib400": NetworkModel("h200_ib400", 8, 450.0, 50.0, 5.0, 15.0, source=_HOPPER_SOURCES),
    "gb200_nvl72": NetworkModel(
        "gb200_nvl72", 72, 900.0, 50.0, 5.0, 15.0,
        source="NVLink 5: 1.8 TB/s per GPU, both directions, 72 GPUs in one NVLink domain (NVIDIA GB200 NVL72 "
        "specifications); a 400 Gb/s NIC per GPU between racks; latencies assumed as for Hopper",
    ),
    "free": NetworkModel("free", 8, float("inf"), float("inf"), 0.0, 0.0, comm_sms=0,
                         source="no cost at all: the compute-only reference"),
}
"""Named clusters; every figure can be overridden (``emulation.*`` settings)."""


def network_model(name: str, **overrides: Optional[float]) -> NetworkModel:
    """The preset ``name`` with ``overrides`` (a ``KeyError`` names the presets)."""
    if name not in PRESETS:
        raise KeyError(f"unknown network {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name].with_overrides(**overrides)


class GroupCosts:
    """The network model's answers for one group, seen from one of its ranks, with what depends only
    on the group's ranks (its slowest link, which peers share this rank's node) worked out once: the
    backend asks for every collective it runs."""

    __slots__ = ("model", "ranks", "me", "_ring_link", "_peer_in_node", "_spans", "_tables")

    def __init__(self, model: NetworkModel, ranks: Sequence[int], me: int) -> None:
        self.model, self.ranks, self.me = model, tuple(ranks), me
        self._spans = model.spans_nodes(self.ranks)
        self._ring_link = model._link(self.ranks) if len(self.ranks) > 1 else (0.0, 1.0)
        node = self.ranks[me] // model.gpus_per_node if self.ranks else 0
        self._peer_in_node = tuple(r // model.gpus_per_node == node for r in self.ranks)
        self._tables: dict[Any, Any] = {}

    def ring(self, kind: str, nbytes: int) -> tuple[float, int]:
        """(modeled seconds, bytes over this GPU's NIC) of a ring collective: as
        :meth:`NetworkModel.seconds` and :meth:`NetworkModel.inter_node_bytes` give."""
        n = len(self.ranks)
        if n <= 1:
            return 0.0, 0
        moved = ALGORITHM_FACTORS[kind](n) * nbytes
        inter = round(moved) if self._spans else 0
        if self.model.free:
            return 0.0, inter
        latency, bandwidth = self._ring_link
        return latency + moved / bandwidth, inter

    def all_to_all_link_bytes(self, bytes_to_peer: Sequence[int]) -> tuple[int, int]:
        """As :meth:`NetworkModel.all_to_all_link_bytes` for this group and rank."""
        intra = inter = 0
        for j, (nbytes, in_node) in enumerate(zip(bytes_to_peer, self._peer_in_node)):
            if j == self.me:
                continue
            if in_node:
                intra += nbytes
            else:
                inter += nbytes
        return intra, inter

    def all_to_all_time(self, intra: int, inter: int) -> float:
        return self.model.all_to_all_time(self.ranks, intra, inter)

    def all_to_all(self, bytes_to_peer: Sequence[int]) -> tuple[float, int, int]:
        """(modeled seconds, bytes to peers, bytes over the NIC) of one all-to-all call sending
        ``bytes_to_peer[j]`` to peer ``j``, NVLink and NIC at once (as :meth:`serial_all_to_all`
        answers for one call per peer)."""
        intra, inter = self.all_to_all_link_bytes(bytes_to_peer)
        return self.all_to_all_time(intra, inter), intra + inter, inter

    def peer_links(self) -> list[tuple[float, float, bool, bool]]:
        """Per rank of the group: (latency in ns, ns per byte, whether the link is the NIC, whether it
        is a peer), as the one-peer-per-call exchange pays them; this rank itself costs nothing."""
        m = self.model
        priced = not m.free and len(self.ranks) > 1
        links = []
        for j, in_node in enumerate(self._peer_in_node):
            peer = j != self.me
            if peer and priced:
                latency_us = m.intra_node_latency_us if in_node else m.inter_node_latency_us
                gbps = m.intra_node_gbps if in_node else m.inter_node_gbps
                links.append((latency_us * 1e3, 1.0 / gbps, not in_node, True))
            else:
                links.append((0.0, 0.0, peer and not in_node, peer))
        return links

    def serial_all_to_all(self, bytes_to_peer: Sequence[int]) -> tuple[float, int, int]:
        """(modeled seconds, bytes to peers, bytes over the NIC) of an exchange that runs one call per
        peer, one after another (the sorted dispatcher's NVSHMEM transport): every peer's latency and
        bytes over its link add up, NVLink and NIC never at once."""
        nanoseconds, sent, inter = 0.0, 0, 0
        for nbytes, (latency_ns, ns_per_byte, nic, peer) in zip(bytes_to_peer, self.peer_links()):
            nanoseconds += latency_ns + nbytes * ns_per_byte
            sent += nbytes if peer else 0
            inter += nbytes if nic else 0
        return nanoseconds * 1e-9, sent, inter

    def link_table(self, device: Any) -> Any:
        """:meth:`peer_links` as a ``[4, n]`` float32 tensor on ``device`` (latency ns, ns per byte,
        NIC flag, peer flag), made once per device: the device-side charge reads it."""
        if device not in self._tables:
            import torch  # deferred: the network model itself is plain Python (validation imports it)

            self._tables[device] = torch.tensor(self.peer_links(), dtype=torch.float32).t().contiguous().to(device)
        return self._tables[device]
