"""megatron-core 0.19.2's knobs beside the EP-overlap schedule, as rules.

:data:`EP_OVERLAP_SCHEDULE_RULES`: the schedule's own variants (early release of the attention
activations, which runs inside it; overlapping the dispatch backward with the expert wgrad, its
megatron-FSDP alternative). :data:`ACTIVATION_MEMORY_RULES`: two features that free GPU memory that
EP overlap costs (two micro-batches in flight): *fine-grained activation offloading*
(``fine_grained_activation_offloading`` with ``offload_modules``: chosen module inputs go to pinned
host memory on a CUDA side stream and come back before their backward) and *paged stash*
(``moe_paged_stash``: the routed experts' activations are packed into fixed pages sized from the
per-rank budget). What each needs, and where this package cannot give it, is decided here, before
launch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.training.config_stages.facts.overlap_facts import ep_on, layers_use_te, resolved_layer_spec
from megatron.bridge.training.config_stages.schema.rule_base import TE_VERSION_VALUE, Rule, RuleContext, field_default

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

OFFLOAD_MODULES: frozenset[str] = frozenset(
    {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act", "fused_group_mlp"}
)
"""The ``offload_modules`` names megatron-core 0.19.2 accepts."""
EXPERT_OFFLOAD_MODULES: frozenset[str] = frozenset({"expert_fc1", "moe_act", "fused_group_mlp"})
"""The names whose offload hooks live in Transformer Engine's grouped experts (``TEGroupedMLP``) only."""
TORCH_NATIVE_OFFLOAD_MODULES: frozenset[str] = frozenset({"attn_norm", "mlp_norm"})
"""The names the torch-native layers train with (on an H200: the same losses as without offloading).
Their attention does not survive megatron-core's offload and reload: ``core_attn`` stopped with "CUDA
driver error: invalid argument", and the attention inputs together failed a compiled kernel's stride
check in the backward (the reload is contiguous)."""
PAGED_STASH_SIZES: tuple[str, ...] = (
    "model.moe_paged_stash_page_size",
    "model.moe_paged_stash_buffer_size_factor_cuda",
    "model.moe_paged_stash_buffer_size_factor_cpu",
)
"""The paged stash's sizes: read only while ``moe_paged_stash`` is on."""

EP_OVERLAP_SCHEDULE_RULES: tuple[Rule, ...] = (
    Rule(
        id="ep-early-attn-release-needs-ep-overlap",
        group="ep-early-release",
        fields=("model.ep_overlap_early_attn_memory_release", "comm_overlap.overlap_moe_expert_parallel_comm"),
        applies=lambda cfg, ctx: bool(cfg.model.ep_overlap_early_attn_memory_release),
        holds=ep_on,
        message="early release of the attention activations reorders the EP-overlap schedule (each layer's "
        "attention backward runs before the next micro-batch's MLP forward, freeing its activations "
        "sooner and exposing the dispatch backward and combine forward); without EP overlap there is no "
        "such schedule and megatron-core asserts",
        fix="set comm_overlap.overlap_moe_expert_parallel_comm=true, "
        "or model.ep_overlap_early_attn_memory_release=false",
    ),
    Rule(
        id="dispatch-wgrad-overlap-not-built",
        group="dispatch-wgrad",
        fields=("model.overlap_dispatch_backward_with_experts_wgrad",),
        applies=lambda cfg, ctx: bool(cfg.model.overlap_dispatch_backward_with_experts_wgrad),
        holds=lambda cfg, ctx: False,
        message="overlapping the dispatch backward with the expert weight gradients is megatron-core's "
        "feature for megatron-FSDP with Transformer Engine (>= 2.3) grouped experts on GPUs: the expert "
        "wgrad runs on a CUDA side stream inside the dispatch backward and hands each gradient to "
        "FSDP's reduce-scatter through a hook (post_wgrad_grad_acc_hook) that only megatron-FSDP "
        "installs. This package trains with megatron's DistributedDataParallel, and its torch-native "
        "and local experts do not defer their wgrad for it, so it is refused rather than run unverified",
        fix="set model.overlap_dispatch_backward_with_experts_wgrad=false; for expert wgrad overlapped "
        "with communication use EP overlap with delayed wgrad (comm_overlap.overlap_moe_expert_parallel_comm"
        "=true, comm_overlap.delay_wgrad_compute=true)",
    ),
)
"""The EP-overlap schedule's variants."""


def _offloading(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return bool(cfg.model.fine_grained_activation_offloading)


def _modules(cfg: ConfigContainer) -> set:
    """The offload module names, as a set (an unset list counts as empty)."""
    return set(cfg.model.offload_modules or ())


def _sizes_changed(cfg: ConfigContainer) -> list[str]:
    """The paged-stash sizes set away from their defaults."""
    return [f for f in PAGED_STASH_SIZES if getattr(cfg.model, f.split(".")[1]) != field_default(cfg, f)]


ACTIVATION_MEMORY_RULES: tuple[Rule, ...] = (
    Rule(
        id="activation-offload-needs-gpu",
        group="activation-offload",
        fields=("model.fine_grained_activation_offloading", "dist.device"),
        applies=_offloading,
        holds=lambda cfg, ctx: cfg.dist.device != "cpu",
        message="fine-grained activation offloading copies module inputs from GPU memory to pinned host "
        "memory on CUDA side streams; in CPU smoke mode they are in host memory already, and "
        "megatron-core's offload manager creates CUDA streams and events",
        fix="set model.fine_grained_activation_offloading=false in CPU mode, or run on GPUs",
    ),
    Rule(
        id="activation-offload-needs-known-modules",
        group="activation-offload",
        fields=("model.offload_modules",),
        applies=_offloading,
        holds=lambda cfg, ctx: bool(_modules(cfg)) and _modules(cfg) <= OFFLOAD_MODULES,
        message="fine-grained activation offloading offloads the inputs of the modules named in "
        f"offload_modules: at least one of {', '.join(sorted(OFFLOAD_MODULES))} (megatron-core asserts)",
        fix="set model.offload_modules to a list of those names (e.g. [qkv_linear, core_attn, attn_proj])",
    ),
    Rule(
        id="activation-offload-attn-proj-needs-core-attn",
        group="activation-offload",
        fields=("model.offload_modules",),
        applies=lambda cfg, ctx: _offloading(cfg, ctx) and "attn_proj" in _modules(cfg),
        holds=lambda cfg, ctx: "core_attn" in _modules(cfg),
        message="attn_proj's input is core_attn's output, which core_attn's backward needs as well: it can "
        "only be offloaded together with core_attn (megatron-core refuses it alone)",
        fix="add core_attn to model.offload_modules, or remove attn_proj",
    ),
    Rule(
        id="activation-offload-expert-modules-need-te-experts",
        group="activation-offload",
        fields=("model.offload_modules", "model.layer_spec", "model.use_transformer_engine_op_fuser"),
        applies=lambda cfg, ctx: _offloading(cfg, ctx) and bool(_modules(cfg) & EXPERT_OFFLOAD_MODULES),
        holds=lambda cfg, ctx: (
            layers_use_te(cfg, ctx)
            and ("fused_group_mlp" not in _modules(cfg) or bool(cfg.model.use_transformer_engine_op_fuser))
        ),
        message="expert_fc1, moe_act and fused_group_mlp are offloaded by Transformer Engine's grouped "
        "experts (fused_group_mlp by its op-fuser path) only; the torch-native and local experts have no "
        "such hooks, so these names would do nothing",
        fix="offload attention and norm inputs only (qkv_linear, core_attn, attn_proj, attn_norm, mlp_norm), "
        "or use model.layer_spec=transformer_engine with Transformer Engine (and "
        "model.use_transformer_engine_op_fuser=true for fused_group_mlp)",
        extra_values=TE_VERSION_VALUE,
    ),
    Rule(
        id="activation-offload-torch-native-norms-only",
        group="activation-offload",
        fields=("model.offload_modules", "model.layer_spec"),
        applies=lambda cfg, ctx: _offloading(cfg, ctx) and resolved_layer_spec(cfg, ctx) == "torch_native",
        holds=lambda cfg, ctx: _modules(cfg) - EXPERT_OFFLOAD_MODULES <= TORCH_NATIVE_OFFLOAD_MODULES,
        message="with the torch-native layers only the norm inputs (attn_norm, mlp_norm) can be offloaded: "
        "their attention does not survive megatron-core's offload and reload (on an H200, core_attn "
        "stopped with 'CUDA driver error: invalid argument' and qkv_linear, core_attn and attn_proj "
        "together failed a compiled kernel's stride check in the backward)",
        fix="offload only attn_norm and mlp_norm with the torch-native layers, or use model.layer_spec=local "
        "(megatron-core's layers: all five attention and norm inputs trained on an H200, with and without EP "
        "overlap, with the same losses as without offloading)",
    ),
    Rule(
        id="offload-modules-need-activation-offload",
        group="activation-offload",
        fields=("model.offload_modules", "model.fine_grained_activation_offloading"),
        applies=lambda cfg, ctx: bool(_modules(cfg)),
        holds=_offloading,
        message="offload_modules is read only with fine-grained activation offloading on; alone it would do nothing",
        fix="set model.fine_grained_activation_offloading=true, or model.offload_modules=[]",
    ),
    Rule(
        id="ncclep-ep-overlap-no-expert-fc1-offload",
        group="activation-offload",
        fields=(
            "model.offload_modules",
            "model.moe_flex_dispatcher_backend",
            "comm_overlap.overlap_moe_expert_parallel_comm",
        ),
        applies=lambda cfg, ctx: (
            _offloading(cfg, ctx)
            and "expert_fc1" in _modules(cfg)
            and cfg.model.moe_token_dispatcher_type == "flex"
            and cfg.model.moe_flex_dispatcher_backend == "ncclep"
        ),
        holds=lambda cfg, ctx: not cfg.comm_overlap.overlap_moe_expert_parallel_comm,
        message="with NCCL EP under EP overlap, offloading expert_fc1 makes FC1 keep its raw input, which the "
        "overlap schedule frees early (megatron-core asserts)",
        fix="remove expert_fc1 from model.offload_modules, or turn EP overlap off",
    ),
    Rule(
        id="paged-stash-not-built",
        group="paged-stash",
        fields=("model.moe_paged_stash",),
        applies=lambda cfg, ctx: bool(cfg.model.moe_paged_stash),
        holds=lambda cfg, ctx: False,
        message="megatron-core's paged stash packs the routed experts' activations into pages inside "
        "Transformer Engine's fused grouped MLP, sized from a static per-rank budget (HybridEP or NCCL EP "
        "with moe_expert_rank_capacity_factor), and relies on its PagedStashRunner around every step to "
        "find a stash overflow or a budget overrun and replay the step without them. This package's "
        "training step does not run that wrapper, so an overflow would lose activations without a word",
        fix="set model.moe_paged_stash=false (to save activation memory use selective recompute, e.g. "
        "model.recompute_modules=[moe_act])",
    ),
    Rule(
        id="paged-stash-sizes-need-paged-stash",
        group="paged-stash",
        fields=PAGED_STASH_SIZES + ("model.moe_paged_stash",),
        applies=lambda cfg, ctx: bool(_sizes_changed(cfg)),
        holds=lambda cfg, ctx: bool(cfg.model.moe_paged_stash),
        message="the page size and the buffer size factors are read only by the paged stash; with "
        "moe_paged_stash off they would do nothing",
        fix="leave the moe_paged_stash_* sizes at their defaults (64, 1.10, 0.0)",
    ),
)
"""Fine-grained activation offloading and paged stash: what runs here, what is refused and why."""
