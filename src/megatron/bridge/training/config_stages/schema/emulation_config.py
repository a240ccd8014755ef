"""``EmulationConfig``: train one rank of an N-GPU layout in this process (``megatron.bridge.emulation``).

Set ``world_size`` to emulate: the run is validated for that many GPUs, this process plays rank
``rank``, and every collective takes the time the network model ``network`` gives it (a preset,
with any figure overridden here). ``world_size=None`` (the default) is a real world.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron.bridge.emulation.network import NetworkModel, network_model
from megatron.bridge.utils.strict_fields import StrictFields


@dataclass(kw_only=True)
class EmulationConfig(StrictFields):
    """The emulated world: its size, the rank this process plays, and the network it is charged for."""

    world_size: int | None = None
    """GPUs of the emulated layout (the harness's ``-ng`` with ``--emulate``); ``None``: a real world."""
    rank: int = 0
    """The rank this process plays."""
    network: str = "h100_ib400"
    """Network preset: ``h100_ib400``, ``h200_ib400``, ``gb200_nvl72`` or ``free`` (no cost)."""
    gpus_per_node: int | None = None
    """GPUs per node (NVLink domain); ``None``: the preset's (the harness passes ``-gn``)."""
    comm_sms: int | None = None
    """SMs a modeled collective keeps busy; ``None``: the preset's."""
    intra_node_gbps: float | None = None
    """NVLink bandwidth a GPU achieves per direction, GB/s; ``None``: the preset's."""
    inter_node_gbps: float | None = None
    """Bandwidth one NIC achieves per direction between nodes, GB/s; ``None``: the preset's."""
    nics_per_gpu: float | None = None
    """NICs per GPU of a node; ``None``: the preset's."""
    intra_node_latency_us: float | None = None
    inter_node_latency_us: float | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size is not None

    def model(self) -> NetworkModel:
        """The network with this section's overrides (the preset must exist: a rule checks it)."""
        return network_model(
            self.network,
            gpus_per_node=self.gpus_per_node,
            comm_sms=self.comm_sms,
            intra_node_gbps=self.intra_node_gbps,
            inter_node_gbps=self.inter_node_gbps,
            nics_per_gpu=self.nics_per_gpu,
            intra_node_latency_us=self.intra_node_latency_us,
            inter_node_latency_us=self.inter_node_latency_us,
        )
