"""What a run says about its emulated world: the start-up line and the ``summary.json`` section.

Both say in plain words that the world is emulated, which network model charged the collectives,
and that communication times are modeled, not measured.
"""

from __future__ import annotations

from typing import Any

from megatron.bridge.emulation.backend import EmulatedWorld

MODELED_NOTE = (
    "EMULATED world: one process trained this rank's work; every other rank was played by symmetry "
    "and every collective took the time of the network model (modeled, not measured); the losses "
    "are not a real run's"
)


def startup_line(world: EmulatedWorld) -> str:
    net = world.network
    nodes = -(-world.world_size // net.gpus_per_node)
    return (
        f"EMULATED world: this process plays rank {world.rank} of {world.world_size} ({nodes} node(s) x "
        f"{net.gpus_per_node} GPUs); the other ranks are played by symmetry; communication times are "
        f"MODELED by network {net.name!r} (achievable rates per direction: NVLink {net.intra_node_gbps:g} GB/s "
        f"a GPU, NIC {net.inter_node_gbps:g} GB/s, {net.nics_per_gpu:g} NIC(s) a GPU; {net.comm_sms} SMs held per "
        f"collective, hold kernel "
        f"{world.hold.kind or 'not yet used'}), not measured"
    )


def summary_section(world: EmulatedWorld, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``'s ``emulation``: the world, the network's figures and every step's record."""
    net = world.network
    return {
        "emulated": True,
        "note": MODELED_NOTE,
        "rank": world.rank,
        "world_size": world.world_size,
        "network": net.figures(),
        "hold_kernel": world.hold.kind,
        "steps": steps,
    }
