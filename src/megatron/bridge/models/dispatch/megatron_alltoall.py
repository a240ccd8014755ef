"""megatron-core's alltoall dispatcher: ``moe_token_dispatcher_type=alltoall`` without a flex backend.

In megatron-core's layers it is the default dispatcher; in the torch-native layers it is what
``model.torch_native_dispatcher=megatron`` keeps (and what ``auto`` falls back to where the sorted
dispatcher would not be exact or would wait for the host anyway). It reads every all-to-all's split
sizes on the host (``all_to_all_single``), so the host waits for the GPU before each exchange.
"""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import BenchmarkArm, DispatchChoice, DispatchPath, DispatchRequest

MEGATRON_TRANSPORT = "all_to_all_single with host split sizes"


def megatron_choice(reason: str) -> DispatchChoice:
    """The torch-native layer keeps megatron's dispatcher, for ``reason``."""
    return DispatchChoice(PATH, MEGATRON_TRANSPORT, False, reason)


def _choose(request: DispatchRequest) -> DispatchChoice:
    return megatron_choice("torch_native_dispatcher='megatron'")


def _describe_choice(choice: DispatchChoice) -> str:
    return f"megatron-core alltoall dispatcher ({choice.reason})"


def _describe(model: Any) -> str:
    return "alltoall"


PATH = DispatchPath(
    name="alltoall",
    kind="megatron",
    summary="megatron-core's alltoall dispatcher: split sizes through the host before every all-to-all",
    token_dispatcher_type="alltoall",
    torch_native_value="megatron",
    describe=_describe,
    transports=(MEGATRON_TRANSPORT,),
    choose=_choose,
    describe_choice=_describe_choice,
    emulated=True,
    benchmark=(BenchmarkArm("alltoall"),),
)
