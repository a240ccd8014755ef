"""The training objects of a run, built with megatron-core from the resolved config.

One model chunk per virtual pipeline stage, ``Float16Module``, megatron ``DistributedDataParallel``
(``cfg.ddp``), megatron's optimizer, ``OptimizerParamScheduler`` and the hooks megatron's schedules
call (grad scaling, no_sync/grad_sync, ``finalize_model_grads``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from megatron.core import tensor_parallel
from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer.module import Float16Module

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.devices.platform import Platform
    from megatron.bridge.training.loop.world import World


def build_model(resolved: ConfigContainer, platform: Platform, ddp_config: Any = None) -> list[Any]:
    """One DDP-wrapped chunk per virtual pipeline stage of this rank; DDP gets ``ddp_config``
    (default ``resolved.ddp``; a captured run moves the NaN check out of it)."""
    m = resolved.model
    vpp = m.virtual_pipeline_model_parallel_size
    stages = [None] if vpp is None else list(range(vpp))
    chunks = []
    for vp_stage in stages:
        chunk = m.provide(vp_stage=vp_stage)
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        chunk = platform.place(chunk)
        if m.fp16 or m.bf16:
            chunk = Float16Module(m, chunk)
        chunks.append(chunk)
    wrapped = [
        DistributedDataParallel(
            config=m,
            ddp_config=resolved.ddp if ddp_config is None else ddp_config,
            module=chunk,
            # Only the first chunk gets bucketing: later chunks' grads are ready much later.
            disable_bucketing=i > 0,
        )
        for i, chunk in enumerate(chunks)
    ]
    if resolved.rng.data_parallel_random_init:
        for chunk in wrapped:
            chunk.broadcast_params()
    return wrapped


def build_optimizer(resolved: ConfigContainer, model: list[Any], world: World) -> Any:
    """megatron-core's optimizer (distributed optimizer when ``optimizer.use_distributed_optimizer``),
    with gloo groups where ``world`` has real peers for them."""
    return get_megatron_optimizer(resolved.optimizer, model, use_gloo_process_groups=world.gloo_process_groups)


def build_scheduler(resolved: ConfigContainer, optimizer: Any) -> Any:
    """``OptimizerParamScheduler`` stepped in samples (as megatron does), from ``cfg.scheduler``."""
    s, o, t = resolved.scheduler, resolved.optimizer, resolved.train
    gbs = t.global_batch_size
    decay_iters = s.lr_decay_iters if s.lr_decay_iters is not None else t.train_iters
    return OptimizerParamScheduler(
        optimizer,
        init_lr=s.lr_warmup_init,
        max_lr=o.lr,
        min_lr=o.min_lr if o.min_lr is not None else 0.0,
        lr_warmup_steps=s.lr_warmup_iters * gbs,
        lr_decay_steps=max(decay_iters, 1) * gbs,
        lr_decay_style=s.lr_decay_style,
        start_wd=s.start_weight_decay if s.start_weight_decay is not None else o.weight_decay,
        end_wd=s.end_weight_decay if s.end_weight_decay is not None else o.weight_decay,
        wd_incr_steps=max(t.train_iters, 1) * gbs,
        wd_incr_style=s.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=True,
        override_opt_param_scheduler=False,
    )


def unwire_model_config(resolved: ConfigContainer) -> None:
    """Undo :func:`wire_model_config`: its hooks are bound methods of the optimizer and the DDP
    chunks, and would keep them alive as long as the config lives (it outlives the run)."""
    config = resolved.model
    config.grad_scale_func = config.no_sync_func = config.grad_sync_func = config.param_sync_func = None


def _one_or_list(hooks: list[Any]) -> Any:
    """megatron takes one hook for one chunk and a list of hooks for several."""
    return hooks[0] if len(hooks) == 1 else hooks


def wire_model_config(resolved: ConfigContainer, model: list[Any], optimizer: Any) -> None:
    """The hooks megatron's schedules call: grad scaling, no_sync/grad_sync, finalize_model_grads."""
    config = resolved.model
    config.grad_scale_func = optimizer.scale_loss
    config.timers = None
    if resolved.ddp.overlap_grad_reduce:
        config.no_sync_func = _one_or_list([chunk.no_sync for chunk in model])
        if resolved.ddp.align_param_gather or len(model) == 1:
            config.grad_sync_func = _one_or_list([chunk.start_grad_sync for chunk in model])
    if resolved.ddp.overlap_param_gather and resolved.ddp.align_param_gather:
        config.param_sync_func = _one_or_list([chunk.start_param_sync for chunk in model])
    config.finalize_model_grads_func = finalize_model_grads
