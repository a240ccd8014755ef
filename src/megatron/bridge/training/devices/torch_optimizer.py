"""Fast optimizer kernels for installs without Apex and Transformer Engine.

megatron-core takes its Adam and its multi-tensor helpers from Transformer Engine or Apex. Without
both it falls back to ``torch.optim.AdamW`` in its default ``foreach`` form (several passes over
every parameter per step) and to Python loops for the gradient norm and clipping. The norm loop is
worse than slow: it builds a host tensor from one GPU scalar per parameter, one device-to-host wait
each (its cost: ``docs/benchmarks/implementation_costs.md``).

:func:`use_torch_fast_paths` switches the fallbacks to torch's own fused kernels: AdamW with
``fused=True`` (one kernel per parameter group, same update rule) and ``torch._foreach`` norms and
scaling (no host waits). It changes nothing where Transformer Engine or Apex provide the kernels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def _inner_optimizers(optimizer: Any) -> Iterator[torch.optim.Optimizer]:
    """The ``torch.optim`` optimizers inside megatron's wrappers (chained, distributed, mixed precision)."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if isinstance(inner, torch.optim.Optimizer):
            yield inner


def _all_cuda_float(group: dict) -> bool:
    return all(p.is_cuda and p.is_floating_point() for p in group["params"])


def fuse_torch_adam(optimizer: Any) -> int:
    """Turn torch's Adam/AdamW inside ``optimizer`` to ``fused=True``; returns the groups switched.

    Safe before the first step only (fused Adam keeps its step counters on the GPU, created at the
    first step).
    """
    switched = 0
    for inner in _inner_optimizers(optimizer):
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            continue
        for group in inner.param_groups:
            if group.get("fused") or group.get("capturable") or not _all_cuda_float(group):
                continue
            if any(inner.state.get(p, {}).get("step") is not None for p in group["params"]):
                continue  # already stepped (e.g. restored state): keep its form
            group["fused"], group["foreach"] = True, False
            switched += 1
    if switched:
        for inner in _inner_optimizers(optimizer):
            inner.register_step_pre_hook(_step_counters_on_device)
    return switched


def _step_counters_on_device(inner: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Fused Adam wants its step counters beside the parameters; a checkpoint may restore them on
    the CPU (the ``foreach`` form keeps them there)."""
    for group in inner.param_groups:
        if not group.get("fused"):
            continue
        for p in group["params"]:
            state = inner.state.get(p)
            step = state.get("step") if state else None
            if step is not None and (not torch.is_tensor(step) or step.device != p.device):
                state["step"] = torch.as_tensor(step, dtype=torch.float32, device=p.device)


def _foreach_l2_norm(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], per_tensor: bool, *args: Any
):
    """Drop-in for Apex's ``multi_tensor_l2norm`` through megatron's local applier (no host waits)."""
    tensors = tensor_lists[0]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device="cuda"), None
    norms = torch._foreach_norm(tensors)
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms])).reshape(1)
    return total, (torch.stack(norms) if per_tensor else None)


def _foreach_scale(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], scale: Any
) -> None:
    """Drop-in for Apex's ``multi_tensor_scale``: ``dst = src * scale`` for every pair."""
    src, dst = tensor_lists
    if not src:
        return
    if all(a is b for a, b in zip(src, dst)):
        torch._foreach_mul_(dst, scale)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def _patch_local_multi_tensor_kernels() -> bool:
    """Point megatron's clip-grad module at the foreach kernels where it uses its local fallbacks."""
    # Deferred: the megatron-core modules these switches patch are imported when they are applied.
    from megatron.core import utils as mcore_utils
    from megatron.core.optimizer import clip_grads

    patched = False
    if getattr(clip_grads, "l2_norm_impl", None) is mcore_utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = _foreach_l2_norm
        patched = True
    if getattr(clip_grads, "multi_tensor_scale_impl", None) is mcore_utils.local_multi_tensor_scale:
        clip_grads.multi_tensor_scale_impl = _foreach_scale
        patched = True
    return patched or clip_grads.l2_norm_impl is _foreach_l2_norm


def use_torch_fast_paths(optimizer: Any) -> str:
    """Apply both switches (CUDA only); returns the start-up line saying what the optimizer runs."""
    if not torch.cuda.is_available():
        return "optimizer kernels: megatron-core's (CPU)"
    fused = fuse_torch_adam(optimizer)
    foreach = _patch_local_multi_tensor_kernels()
    if not fused and not foreach:
        return "optimizer kernels: megatron-core's (Transformer Engine / Apex)"
    parts = []
    if fused:
        parts.append(f"torch AdamW fused ({fused} parameter groups)")
    if foreach:
        parts.append("grad norm and clipping via torch._foreach")
    return "optimizer kernels: " + ", ".join(parts) + " (Transformer Engine and Apex absent)"
