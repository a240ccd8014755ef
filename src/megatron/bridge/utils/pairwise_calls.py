"""The order of an exchange that talks to one peer per call: in call ``k`` rank ``r`` and rank ``r ^ k``
swap rows.

The sorted dispatcher's NVSHMEM transport sends to one peer per call (``symmetric_exchange.py`` says
why), and each call lasts as long as its slowest pair. Pairing by XOR keeps a call's pairs on one kind
of link: where a node holds an aligned power-of-two block of ranks, calls ``1 .. gpus_per_node - 1``
pair ranks of the same node only (NVLink) and the rest pair ranks of different nodes only (the NIC),
so no NVLink call waits for a NIC pair. A rotation (``r`` sends to ``r + k``) puts a NIC pair in every
call of a group that spans nodes. The network model prices the transport by the same function.
"""

from __future__ import annotations

from typing import Any


def is_power_of_two(world: int) -> bool:
    """Whether ``world`` ranks can pair by XOR (every ``r ^ k`` is a rank of the group)."""
    return world > 0 and world & (world - 1) == 0


def call_peer(rank: Any, call: Any, world: int) -> Any:
    """The rank that ``rank`` sends to and receives from in call ``call`` (call 0: itself) of a
    ``world``-rank exchange; ``rank`` or ``call`` may be an integer tensor (element-wise)."""
    if not is_power_of_two(world):
        raise ValueError(f"a pairwise exchange pairs ranks by XOR: its group size must be a power of two, not {world}")
    return rank ^ call
