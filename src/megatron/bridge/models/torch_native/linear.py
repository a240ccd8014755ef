"""Dense linear layers whose weight gradient lands straight in megatron DDP's fp32 ``main_grad``.

Why: megatron-core's ``ColumnParallelLinear``/``RowParallelLinear`` fuse the weight-gradient
accumulation only with ``gradient_accumulation_fusion`` on (Apex's extension, or this package's
``grad_accumulation_fusion.py`` where Apex is absent). With it off every backward writes a bf16
weight gradient, and DDP's hook reads it back and adds it into the fp32
``main_grad``, a full extra pass over the largest weights (measured: ``docs/benchmarks/implementation_costs.md``).
Here one cuBLAS GEMM with an fp32 result adds ``dy^T x`` into ``main_grad`` in place
(``torch.addmm(..., out_dtype=torch.float32)``), so the gradient is also never rounded to bf16.

Only calls this module can take over exactly are rerouted: tensor-parallel size 1 (no sequence
parallelism, no all-reduce of the input gradient), no deferred embedding wgrad, a trainable
weight, and megatron's own fusion off. Every other call runs megatron-core's function unchanged.
The forward and the input gradient are the same matmuls megatron-core runs.

:func:`route_weight_gradients_into_main_grad` gives a built model these layers; the setting is
``model.torch_native_wgrad_accumulation`` (the same one the grouped experts read).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

from megatron.bridge.models.grad_accumulation_fusion import addmm_out_dtype_runs, wgrad_gemm_accum_fp32
from megatron.bridge.models.torch_native.backends import fuses_wgrad_into_main_grad


def can_fuse(main_grad: torch.Tensor) -> bool:
    """Whether :func:`accumulate_dense_wgrad` runs for this ``main_grad`` (fp32, contiguous, CUDA)."""
    return (
        main_grad.dtype == torch.float32
        and main_grad.is_contiguous()
        and main_grad.is_cuda
        and addmm_out_dtype_runs(main_grad.device.type)
    )


def accumulate_dense_wgrad(dy: torch.Tensor, x: torch.Tensor, main_grad: torch.Tensor) -> None:
    """``main_grad += dy^T @ x`` for 2-D ``dy [T, out]`` and ``x [T, in]``, product kept in fp32."""
    wgrad_gemm_accum_fp32(x, dy, main_grad)


def fuses_into_main_grad(weight: torch.Tensor, accumulation: str) -> bool:
    """Whether this weight's gradient goes straight into its ``main_grad``.

    ``accumulation`` is ``model.torch_native_wgrad_accumulation``; an explicit ``fused`` that cannot
    run on this ``main_grad`` is an error, not a silent fallback.
    """
    return fuses_wgrad_into_main_grad(
        weight, accumulation, can_fuse, "an fp32 CUDA main_grad and a torch with addmm(out_dtype=)"
    )


class MainGradLinearFunction(torch.autograd.Function):
    """``y = x W^T + b``; the backward adds ``W``'s gradient into ``W.main_grad`` itself."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # noqa: D102
        ctx.save_for_backward(x, weight)
        # The parameter itself, for its main_grad and DDP's flag: under saved-tensor hooks (megatron-
        # core's fine-grained activation offloading) ctx.saved_tensors gives back a plain-tensor alias
        # of the weight, without the parameter's attributes.
        ctx.param = weight
        ctx.has_bias = bias is not None
        out = torch.matmul(x, weight.t())
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, dy):  # noqa: D102
        x, weight = ctx.saved_tensors
        dx = dy.matmul(weight)
        dy2d, x2d = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        accumulate_dense_wgrad(dy2d, x2d, ctx.param.main_grad)
        # DDP's hook must not add the placeholder below; it still wants a gradient to see (its hook
        # fires from the accumulator), so an uninitialised one of the right shape is returned, as
        # megatron-core's fused linear layers do.
        ctx.param.grad_added_to_main_grad = True
        db = dy2d.sum(dim=0) if ctx.has_bias else None
        return dx, torch.empty_like(weight), db


def _takes_over(weight: torch.Tensor, call: dict[str, Any], accumulation: str) -> bool:
    """Whether this call of megatron's linear function is one this module computes exactly."""
    plain = (
        not call.get("sequence_parallel")
        and not call.get("allreduce_dgrad")
        and call.get("grad_output_buffer") is None
        and call.get("gtp_remat_size", 1) == 1
        and not call.get("gradient_accumulation_fusion")
    )
    owned_by_fsdp = hasattr(weight, "__fsdp_param__")  # megatron-FSDP manages its own main_grad
    return plain and weight.requires_grad and not owned_by_fsdp and fuses_into_main_grad(weight, accumulation)


class _MainGradForward:
    """megatron-core's ``_forward_impl`` hook of its parallel linear layers, rerouted where exact."""

    def _forward_impl(self, input, weight, *args, **kwargs):  # noqa: A002 (megatron's keyword)
        accumulation = getattr(self.config, "torch_native_wgrad_accumulation", "auto")
        if not args and _takes_over(weight, kwargs, accumulation):
            return MainGradLinearFunction.apply(input, weight, kwargs.get("bias"))
        return super()._forward_impl(input, weight, *args, **kwargs)


class MainGradColumnParallelLinear(_MainGradForward, ColumnParallelLinear):
    """megatron-core's ``ColumnParallelLinear`` with the weight gradient added into ``main_grad``."""


class MainGradRowParallelLinear(_MainGradForward, RowParallelLinear):
    """megatron-core's ``RowParallelLinear`` with the weight gradient added into ``main_grad``."""


_REROUTED = {ColumnParallelLinear: MainGradColumnParallelLinear, RowParallelLinear: MainGradRowParallelLinear}


def reroute_blockers(config: Any) -> list[str]:
    """Why a model of this config keeps megatron's dense layers (empty: it gets the rerouted ones).

    With tensor parallelism, deferred embedding wgrad or megatron's own (Apex) fusion every call would
    go to megatron's function anyway.
    """
    checks = (
        (config.tensor_model_parallel_size != 1, f"tensor_model_parallel_size={config.tensor_model_parallel_size}"),
        (bool(config.defer_embedding_wgrad_compute), "defer_embedding_wgrad_compute"),
        (bool(config.gradient_accumulation_fusion), "gradient_accumulation_fusion (megatron's own fusion)"),
    )
    return [why for blocked, why in checks if blocked]


def reroutes_dense_layers(config: Any) -> bool:
    """Whether a model of this config gets the rerouted layers (see :func:`reroute_blockers`)."""
    return not reroute_blockers(config)


def route_weight_gradients_into_main_grad(model: torch.nn.Module) -> int:
    """Give every plain megatron parallel linear layer of ``model`` the rerouted backward; returns how many.

    The attention projections come from the layer spec, the output layer from ``GPTModel`` itself, so
    the layers are switched after the model is built: each keeps its state and gains only the
    ``_forward_impl`` above (the same kind of class swap ``torch.distributed.fsdp.fully_shard`` does).
    Subclasses of megatron's layers are left alone.
    """
    switched = 0
    for module in model.modules():
        rerouted = _REROUTED.get(type(module))
        if rerouted is not None:
            module.__class__ = rerouted
            switched += 1
    return switched


def dense_wgrad_accumulation(model_chunks: Iterable[torch.nn.Module]) -> dict[str, Any] | None:
    """Which accumulation the dense layers of these (DDP-wrapped) torch-native chunks use, read from
    the built layers; ``None`` for models of megatron's layer specs."""
    modules = [m for chunk in model_chunks for m in chunk.modules()]
    layers = [m for m in modules if isinstance(m, _MainGradForward)]
    if not layers:
        return _kept_with_megatron(modules)
    setting = getattr(layers[0].config, "torch_native_wgrad_accumulation", "auto")
    fused = [m for m in layers if m.weight is not None and fuses_into_main_grad(m.weight, setting)]
    how = "fused: cuBLAS adds into the fp32 main_grad" if fused else "unfused: bf16 gradient added by DDP's hook"
    return {
        "setting": setting,
        "path": "fused" if fused else "unfused",
        "layers": len(layers),
        "description": f"dense weight gradients {how} ({len(fused)} of {len(layers)} linear layers; "
        f"torch_native_wgrad_accumulation={setting!r})",
    }


def _kept_with_megatron(modules: list[torch.nn.Module]) -> dict[str, Any] | None:
    """The report for a torch-native model whose dense layers stayed megatron's (and why)."""
    plain = next((m for m in modules if type(m) in _REROUTED), None)
    config = getattr(plain, "config", None)
    if config is None or getattr(config, "resolved_layer_spec", None) != "torch_native":
        return None
    setting = getattr(config, "torch_native_wgrad_accumulation", "auto")
    why = "; ".join(reroute_blockers(config)) or "not rerouted"
    return {
        "setting": setting,
        "path": "megatron",
        "layers": 0,
        "description": f"dense weight gradients: megatron-core's linear layers ({why}; "
        f"torch_native_wgrad_accumulation={setting!r} applies to the experts only)",
    }
