"""``model.gradient_accumulation_fusion`` without Apex: megatron-core's linear layers add their weight
gradient straight into ``main_grad`` through this package's GEMM.

Transformer Engine's layers fuse the accumulation themselves (``fuse_wgrad_accumulation``). megatron-
core's own ``ColumnParallelLinear``/``RowParallelLinear`` (the output layer of every model, and every
linear layer of the ``local`` and ``torch_native`` specs) do it only through Apex's CUDA extension
``fused_weight_gradient_mlp_cuda``; without Apex, ``ColumnParallelLinear`` refuses to be built with
the flag on. :func:`provide_missing_kernel` gives megatron-core the two functions it calls from that
extension when it does not import, implemented here:

* ``wgrad_gemm_accum_fp32(input, grad_output, main_grad)``: ``main_grad += grad_output^T @ input``
  into an fp32 ``main_grad``, one cuBLAS GEMM with an fp32 result on CUDA
  (``torch.addmm(..., out_dtype=torch.float32)``), so the product is never rounded to bf16;
* ``wgrad_gemm_accum_fp16``: the same into a bf16/fp16 ``main_grad``.

On CPU (smoke mode) the product is computed in ``main_grad``'s dtype. Apex's extension, where it is
installed, is left in place and used.
"""

from __future__ import annotations

import functools
import importlib
import sys

import torch
from megatron.core.tensor_parallel import layers

KERNEL_MODULE = "fused_weight_gradient_mlp_cuda"
"""The name under which megatron-core imports Apex's extension."""

APEX = "apex"
THIS_PACKAGE = "megatron.bridge"


@functools.cache
def addmm_out_dtype_runs(device_type: str) -> bool:
    """Whether ``addmm(..., out_dtype=float32, out=)`` with bf16 inputs runs on this device type.

    Tried once on 1x1 tensors: the operator's meta function is no guide (torch 2.11 has the CUDA
    kernel but its meta check refused the call), and CPU builds have no kernel at all.
    """
    acc = torch.zeros(1, 1, device=device_type)
    half = torch.ones(1, 1, device=device_type, dtype=torch.bfloat16)
    try:
        torch.addmm(acc, half, half, out_dtype=torch.float32, out=acc)
    except (TypeError, RuntimeError, NotImplementedError):
        return False
    return True


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """``main_grad += grad_output^T @ total_input`` for an fp32 ``main_grad`` (megatron-core's call)."""
    x, dy = _as_rows(total_input), _as_rows(grad_output)
    if main_grad.is_cuda and x.dtype != torch.float32 and addmm_out_dtype_runs(main_grad.device.type):
        torch.addmm(main_grad, dy.t(), x, out_dtype=torch.float32, out=main_grad)
        return
    main_grad.addmm_(dy.t().to(main_grad.dtype), x.to(main_grad.dtype))


def wgrad_gemm_accum_fp16(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """``main_grad += grad_output^T @ total_input`` for a bf16/fp16 ``main_grad`` (megatron-core's call)."""
    x, dy = _as_rows(total_input), _as_rows(grad_output)
    main_grad.addmm_(dy.t().to(main_grad.dtype), x.to(main_grad.dtype))


def _apex_kernel() -> object | None:
    """Apex's extension when it imports (never this module standing in for it)."""
    module = sys.modules.get(KERNEL_MODULE)
    if module is sys.modules[__name__]:
        return None
    try:
        return module or importlib.import_module(KERNEL_MODULE)
    except ImportError:
        return None


def kernel_in_use() -> str:
    """Which implementation megatron-core's linear layers fuse with: ``apex`` or this package's."""
    return APEX if _apex_kernel() is not None else THIS_PACKAGE


def provide_missing_kernel() -> str:
    """Let megatron-core's linear layers fuse the accumulation; returns which kernel they use.

    With Apex's extension present nothing changes. Otherwise this module is made the extension
    megatron-core finds: its layers module (imported before, with the flag that says the
    extension is missing) and any later ``import fused_weight_gradient_mlp_cuda`` (megatron's
    deferred embedding wgrad imports it inside a function).
    """
    if _apex_kernel() is not None:
        return APEX
    this = sys.modules[__name__]
    sys.modules[KERNEL_MODULE] = this
    layers.fused_weight_gradient_mlp_cuda = this
    layers._grad_accum_fusion_available = True
    return THIS_PACKAGE


def describe(layer_spec: str, device_type: str) -> str:
    """One start-up line: where each kind of layer adds its weight gradient with the fusion on."""
    kernel = kernel_in_use()
    if kernel == APEX:
        how = "Apex's fused_weight_gradient_mlp_cuda"
    elif device_type == "cuda":
        how = "this package's cuBLAS GEMM with an fp32 result (Apex absent)"
    else:
        how = "this package's matmul in main_grad's dtype (CPU, Apex absent)"
    te = "Transformer Engine's layers fuse into main_grad themselves; " if layer_spec == "transformer_engine" else ""
    return f"gradient accumulation fusion: {te}megatron-core's linear layers add into main_grad with {how}"
