"""Names of the kernel choices of the torch-native layers, defined once.

The provider's fields (``model.torch_native_grouped_gemm_backend``,
``model.torch_native_cross_entropy_backend``, ``model.torch_native_wgrad_accumulation``), the kernels that act on
them and the rules that check them all read these; the module imports nothing heavy, so validation can use it anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch

GroupedGemmBackend = Literal["auto", "grouped_mm", "grouped_mm_padded", "loop"]
"""``grouped_mm``: ``torch._grouped_mm`` (bf16 on CUDA compute capability 9.0 or newer);
``grouped_mm_padded``: the same with every expert's rows padded to a multiple of 16 (torch builds
that need aligned groups); ``loop``: one matmul per expert; ``auto``: the first that runs here."""
GROUPED_GEMM_BACKENDS: tuple[str, ...] = get_args(GroupedGemmBackend)
GROUPED_MM_BACKENDS: tuple[str, ...] = ("grouped_mm", "grouped_mm_padded")

CrossEntropyBackend = Literal["auto", "triton", "torch"]
"""``triton``: the streaming Triton kernels (CUDA); ``torch``: the chunked PyTorch version;
``auto``: Triton on CUDA where it imports, PyTorch elsewhere."""
CROSS_ENTROPY_BACKENDS: tuple[str, ...] = get_args(CrossEntropyBackend)

WgradAccumulation = Literal["auto", "fused", "unfused"]
"""How expert weight gradients reach megatron DDP's fp32 ``main_grad``: ``fused`` (one Triton kernel
adds the grouped GEMM's fp32 product straight into ``main_grad``), ``unfused`` (a bf16 gradient that
DDP's hook adds), ``auto`` (``fused`` where ``main_grad`` is an fp32 CUDA tensor and Triton imports)."""
WGRAD_ACCUMULATIONS: tuple[str, ...] = get_args(WgradAccumulation)


def fuses_wgrad_into_main_grad(
    weight: torch.Tensor, accumulation: str, can_fuse: Callable[[torch.Tensor], bool], needs: str
) -> bool:
    """Whether ``weight``'s gradient goes straight into its ``main_grad`` under ``accumulation``.

    ``can_fuse`` says whether the layer's kernel runs on that ``main_grad``; ``needs`` names what
    it needs, for the error an explicit ``fused`` gets where it cannot run (no silent fallback).
    Without a ``main_grad`` (no megatron DDP) or with ``unfused``, the gradient goes to autograd.
    """
    main_grad = getattr(weight, "main_grad", None)
    if accumulation == "unfused" or main_grad is None:
        return False
    fusable = can_fuse(main_grad)
    if accumulation == "fused" and not fusable:
        raise RuntimeError(
            f"model.torch_native_wgrad_accumulation='fused' needs {needs}; this weight's main_grad is "
            f"{main_grad.dtype} on {main_grad.device}. Use auto or unfused."
        )
    return fusable
