"""megatron-core's allgather dispatcher (``moe_token_dispatcher_type=allgather``): every rank gathers
every token and keeps those of its experts. The torch-native layers do not replace it (their
dispatchers stand in for the alltoall one only)."""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import DispatchPath


def _describe(model: Any) -> str:
    return "allgather"


PATH = DispatchPath(
    name="allgather",
    kind="megatron",
    summary="megatron-core's allgather dispatcher: every rank gathers every token",
    token_dispatcher_type="allgather",
    describe=_describe,
    emulated=True,
)
