"""Rules for the torch-native kernel fields (``model.torch_native_compile``,
``model.torch_native_grouped_gemm_backend``, ``model.torch_native_cross_entropy_backend``,
``model.torch_native_wgrad_accumulation``), as data.

These settings pick kernels for A/B timing and debugging. A value that names no kernel, a kernel
that cannot run on the target, and a setting that would change nothing in this run (another layer
spec or loss, CPU smoke mode) are refused before launch, so every accepted value has its effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.models.torch_native.backends import (
    CROSS_ENTROPY_BACKENDS,
    GROUPED_GEMM_BACKENDS,
    GROUPED_MM_BACKENDS,
    WGRAD_ACCUMULATIONS,
)
from megatron.bridge.training.config_stages.rules.dispatch_rules import uses_torch_native_layers
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

GROUPED_MM_MIN_CAPABILITY = (9, 0)


def _layer_kernel_fields_set(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    m = cfg.model
    return (
        not m.torch_native_compile
        or m.torch_native_grouped_gemm_backend != "auto"
        or m.torch_native_wgrad_accumulation != "auto"
    )


def _grouped_mm_runs(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """bf16 on a CUDA GPU of compute capability 9.0+ (an unknown target GPU is not held against it)."""
    capable = ctx.device_capability is None or tuple(ctx.device_capability) >= GROUPED_MM_MIN_CAPABILITY
    return cfg.dist.device == "cuda" and bool(cfg.model.bf16) and capable


TORCH_NATIVE_KERNEL_RULES: tuple[Rule, ...] = (
    Rule(
        id="torch-native-grouped-gemm-backend-known",
        fields=("model.torch_native_grouped_gemm_backend",),
        holds=lambda cfg, ctx: cfg.model.torch_native_grouped_gemm_backend in GROUPED_GEMM_BACKENDS,
        message=f"the expert GEMM backend is one of {', '.join(GROUPED_GEMM_BACKENDS)}",
        fix="use auto (the fastest that runs here), grouped_mm, grouped_mm_padded or loop",
    ),
    Rule(
        id="torch-native-cross-entropy-backend-known",
        fields=("model.torch_native_cross_entropy_backend",),
        holds=lambda cfg, ctx: cfg.model.torch_native_cross_entropy_backend in CROSS_ENTROPY_BACKENDS,
        message=f"the cross-entropy backend is one of {', '.join(CROSS_ENTROPY_BACKENDS)}",
        fix="use auto (Triton on CUDA, PyTorch elsewhere), triton or torch",
    ),
    Rule(
        id="torch-native-kernel-settings-need-torch-native-layers",
        fields=(
            "model.layer_spec",
            "model.torch_native_compile",
            "model.torch_native_grouped_gemm_backend",
            "model.torch_native_wgrad_accumulation",
        ),
        applies=_layer_kernel_fields_set,
        holds=uses_torch_native_layers,
        message="torch_native_compile, torch_native_grouped_gemm_backend and torch_native_wgrad_accumulation "
        "only act on the torch-native layers; with this layer spec they would have no effect",
        fix="set model.layer_spec=torch_native, or leave model.torch_native_compile=true, "
        "model.torch_native_grouped_gemm_backend=auto and model.torch_native_wgrad_accumulation=auto",
    ),
    Rule(
        id="torch-native-compile-off-needs-cuda",
        fields=("model.torch_native_compile", "dist.device"),
        applies=lambda cfg, ctx: not cfg.model.torch_native_compile,
        holds=lambda cfg, ctx: cfg.dist.device == "cuda",
        message="nothing is compiled in CPU smoke mode, so torch_native_compile=false would have no effect",
        fix="leave model.torch_native_compile=true in CPU smoke mode",
    ),
    Rule(
        id="grouped-mm-needs-hopper-bf16",
        fields=("model.torch_native_grouped_gemm_backend", "dist.device", "model.bf16"),
        applies=lambda cfg, ctx: cfg.model.torch_native_grouped_gemm_backend in GROUPED_MM_BACKENDS,
        holds=_grouped_mm_runs,
        message="torch._grouped_mm runs bf16 on CUDA GPUs of compute capability 9.0 or newer",
        fix="use model.torch_native_grouped_gemm_backend=auto (it picks grouped_mm where it runs) or loop",
        derived_values=(("target_gpu_capability", lambda cfg, ctx: ctx.device_capability),),
    ),
    Rule(
        id="cross-entropy-backend-needs-torch-native-loss",
        fields=(
            "model.torch_native_cross_entropy_backend",
            "model.cross_entropy_loss_fusion",
            "model.cross_entropy_fusion_impl",
        ),
        applies=lambda cfg, ctx: cfg.model.torch_native_cross_entropy_backend != "auto",
        holds=lambda cfg, ctx: cfg.model.uses_torch_native_loss,
        message="the cross-entropy backend only acts on the torch-native loss; with this loss it would have no effect",
        fix="set model.cross_entropy_loss_fusion=true and model.cross_entropy_fusion_impl=torch_native, "
        "or leave model.torch_native_cross_entropy_backend=auto",
    ),
    Rule(
        id="triton-cross-entropy-needs-cuda",
        fields=("model.torch_native_cross_entropy_backend", "dist.device"),
        applies=lambda cfg, ctx: cfg.model.torch_native_cross_entropy_backend == "triton",
        holds=lambda cfg, ctx: cfg.dist.device == "cuda",
        message="the Triton cross-entropy kernels run on CUDA tensors only",
        fix="use model.torch_native_cross_entropy_backend=auto or torch in CPU smoke mode",
    ),
    Rule(
        id="torch-native-wgrad-accumulation-known",
        fields=("model.torch_native_wgrad_accumulation",),
        holds=lambda cfg, ctx: cfg.model.torch_native_wgrad_accumulation in WGRAD_ACCUMULATIONS,
        message=f"the expert weight-gradient accumulation is one of {', '.join(WGRAD_ACCUMULATIONS)}",
        fix="use auto (fused where it runs), fused or unfused",
    ),
    Rule(
        id="fused-wgrad-accumulation-needs-cuda",
        fields=("model.torch_native_wgrad_accumulation", "dist.device"),
        applies=lambda cfg, ctx: cfg.model.torch_native_wgrad_accumulation == "fused",
        holds=lambda cfg, ctx: cfg.dist.device == "cuda",
        message="the fused weight-gradient accumulation runs on CUDA tensors (a Triton kernel for the experts, a "
        "cuBLAS GEMM for the dense layers)",
        fix="use model.torch_native_wgrad_accumulation=auto or unfused in CPU smoke mode",
    ),
    Rule(
        id="fused-wgrad-accumulation-needs-fp32-main-grad",
        fields=("model.torch_native_wgrad_accumulation", "ddp.grad_reduce_in_fp32"),
        applies=lambda cfg, ctx: cfg.model.torch_native_wgrad_accumulation == "fused",
        holds=lambda cfg, ctx: bool(cfg.ddp.grad_reduce_in_fp32),
        message="the fused weight-gradient accumulation adds into an fp32 main_grad; with "
        "ddp.grad_reduce_in_fp32=false the gradient buffers are bf16",
        fix="set ddp.grad_reduce_in_fp32=true, or model.torch_native_wgrad_accumulation=auto or unfused",
    ),
)
