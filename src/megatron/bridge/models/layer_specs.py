"""Choice of the transformer layer implementation: Transformer Engine, plain megatron-core, torch-native.

``model.layer_spec="auto"`` is decided once per run by :func:`choose_layer_spec`, in this order:

1. a CPU run (``dist.device=cpu``): torch-native, whether or not Transformer Engine imports (TE's
   layers need CUDA);
2. Transformer Engine absent: torch-native;
3. the run asks for something only TE's layers provide (FP8/FP4 compute, TE's per-layer CUDA
   graphs, tensor-parallel communication overlap): Transformer Engine;
4. otherwise torch-native: for bf16/fp16 it trains the Qwen3-MoE proxy faster than the TE layer
   spec does on an H200 (``docs/benchmarks/layer_specs.md``).

The torch-native spec is SDPA core attention and grouped-GEMM experts on megatron-core's own
layers; the plain ``"local"`` spec loops over experts in Python and is an order of magnitude
slower. The choice and its reason are on the start-up line and in ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from megatron.bridge.utils.host import current_host
from megatron.bridge.utils.import_utils import have_transformer_engine

if TYPE_CHECKING:
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from megatron.bridge.models.gpt_provider import GPTModelProvider

LayerSpecName = Literal["auto", "transformer_engine", "local", "torch_native"]
LAYER_SPEC_CHOICES: tuple[str, ...] = ("auto", "transformer_engine", "local", "torch_native")

LAYER_SPEC_EVIDENCE = "docs/benchmarks/layer_specs.md"
"""Where the measurement behind rule 4 is published."""


@dataclass(frozen=True)
class LayerSpecChoice:
    """The layer implementation a run builds and why (``reason`` is shown to the user)."""

    name: LayerSpecName
    reason: str


def te_only_features(model: Any, tp_comm_overlap: bool, fp8: str | None = None, fp4: str | None = None) -> list[str]:
    """What the run asks for that only Transformer Engine's layers provide (empty: nothing).

    ``tp_comm_overlap`` is the effective value of ``comm_overlap.tp_comm_overlap`` (its owner);
    ``fp8``/``fp4`` the formats of the run's precision recipe (``None``: ``model.fp8``/``model.fp4``).
    """
    fp8 = fp8 if fp8 is not None else getattr(model, "fp8", None)
    fp4 = fp4 if fp4 is not None else getattr(model, "fp4", None)
    wants = (
        (fp8 is not None, f"FP8 compute (fp8={fp8!r})"),
        (fp4 is not None, f"FP4 compute (fp4={fp4!r})"),
        (
            getattr(model, "cuda_graph_impl", None) == "transformer_engine",
            "Transformer Engine's per-layer CUDA graphs (model.cuda_graph_impl=transformer_engine)",
        ),
        (bool(tp_comm_overlap), "tensor-parallel communication overlap (comm_overlap.tp_comm_overlap)"),
    )
    return [why for wanted, why in wants if wanted]


def choose_layer_spec(
    requested: str, *, device: str, te_available: bool, te_features: Sequence[str] = ()
) -> LayerSpecChoice:
    """The implementation a run with these facts builds; explicit choices pass through.

    ``device`` is ``dist.device`` (``cuda``/``cpu``), ``te_available`` whether Transformer Engine
    imports on the machine that trains, ``te_features`` what :func:`te_only_features` found.
    """
    if requested != "auto":
        return LayerSpecChoice(requested, "requested")
    if device == "cpu":
        return LayerSpecChoice("torch_native", "auto: a CPU run; Transformer Engine's layers need CUDA")
    if not te_available:
        return LayerSpecChoice("torch_native", "auto: Transformer Engine absent")
    if te_features:
        return LayerSpecChoice("transformer_engine", "auto: needed by " + ", ".join(te_features))
    return LayerSpecChoice(
        "torch_native",
        "auto: no feature here needs Transformer Engine, and for bf16/fp16 the torch-native layers "
        f"train faster than TE's ({LAYER_SPEC_EVIDENCE})",
    )


def choose_for_model(model: Any, device: str | None = None) -> LayerSpecChoice:
    """:func:`choose_layer_spec` for a model config used on its own (no ``ConfigContainer``).

    A run's choice is made by its resolution, which knows ``dist.device`` and the owner of
    ``tp_comm_overlap``; a bare provider reads its own fields and, without ``device``, takes CUDA
    when a GPU is visible.
    """
    if device is None:
        device = "cuda" if current_host().gpu_count() else "cpu"
    return choose_layer_spec(
        model.layer_spec,
        device=device,
        te_available=have_transformer_engine(),
        te_features=te_only_features(model, getattr(model, "tp_comm_overlap", False)),
    )


def build_decoder_block_spec(config: GPTModelProvider, vp_stage: int | None = None) -> TransformerBlockSubmodules:
    """The decoder block spec for this pipeline stage with the resolved implementation."""
    # Deferred: the layer specs bring every layer implementation (Transformer Engine's when
    # installed); the configuration, which imports this module, is imported without them.
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    impl = config.resolved_layer_spec
    if impl in ("transformer_engine", "local"):
        return get_gpt_decoder_block_spec(
            config, use_transformer_engine=(impl == "transformer_engine"), vp_stage=vp_stage
        )
    if impl == "torch_native":
        # Deferred, as above (the package loads its layer specs on first use).
        from megatron.bridge.models.torch_native import get_torch_native_decoder_block_spec

        return get_torch_native_decoder_block_spec(config, vp_stage=vp_stage)
    raise ValueError(
        f"model.layer_spec={config.layer_spec!r} is not one of {LAYER_SPEC_CHOICES}; "
        'pick one of them ("auto" chooses for this machine).'
    )
