"""Choice of the transformer layer implementation: Transformer Engine, plain megatron-core, torch-native.

``"auto"`` takes Transformer Engine when it imports and the torch-native spec otherwise (SDPA core
attention and grouped-GEMM experts on megatron-core's own layers; the plain ``"local"`` spec loops
over experts in Python and is an order of magnitude slower). The choice is reported at start-up
(``describe_layer_spec``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Optional

from megatron.bridge.utils.import_utils import describe_transformer_engine, have_transformer_engine

if TYPE_CHECKING:
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from megatron.bridge.models.gpt_provider import GPTModelProvider

LayerSpecName = Literal["auto", "transformer_engine", "local", "torch_native"]
LAYER_SPEC_CHOICES: tuple[str, ...] = ("auto", "transformer_engine", "local", "torch_native")


def resolve_layer_spec(requested: str, te_available: Optional[bool] = None) -> str:
    """Map ``"auto"`` to the implementation a machine can run; explicit choices pass through.

    ``te_available`` describes the target machine (a dry run validates for the cluster);
    ``None`` asks this machine.
    """
    if requested != "auto":
        return requested
    if te_available is None:
        te_available = have_transformer_engine()
    return "transformer_engine" if te_available else "torch_native"


def describe_layer_spec(requested: str) -> str:
    """One line for the start-up log: which layer implementation and why."""
    resolved = resolve_layer_spec(requested)
    if requested != "auto":
        reason = "requested"
    elif resolved == "torch_native":
        reason = (
            f"auto, Transformer Engine {describe_transformer_engine()}: SDPA attention, "
            "grouped-GEMM experts and compiled RMSNorm on megatron-core layers"
        )
    else:
        reason = f"auto, Transformer Engine {describe_transformer_engine()}"
    return f"layer spec: {resolved} ({reason})"


def build_decoder_block_spec(
    config: "GPTModelProvider", vp_stage: Optional[int] = None
) -> "TransformerBlockSubmodules":
    """The decoder block spec for this pipeline stage with the resolved implementation."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    impl = resolve_layer_spec(config.layer_spec)
    if impl in ("transformer_engine", "local"):
        return get_gpt_decoder_block_spec(
            config, use_transformer_engine=(impl == "transformer_engine"), vp_stage=vp_stage
        )
    if impl == "torch_native":
        from megatron.bridge.models.torch_native import get_torch_native_decoder_block_spec

        return get_torch_native_decoder_block_spec(config, vp_stage=vp_stage)
    raise ValueError(
        f"model.layer_spec={config.layer_spec!r} is not one of {LAYER_SPEC_CHOICES}; "
        "pick one of them (\"auto\" chooses for this machine)."
    )
