"""``pretrain(cfg)``: real megatron-core training of a GPT/MoE model, on GPUs or in CPU smoke mode.

Order of work, chosen so that mistakes cost seconds, not a cluster allocation:

1. the arguments (``loop/pretrain_arguments.py``), then ``cfg.resolve()``: one resolution with every
   rule checked and the overlap report (no process group, no CUDA);
2. the platform (``platform.py``: GPUs or CPU smoke mode) prepares the
   process: ``CUDA_DEVICE_MAX_CONNECTIONS`` from the report *before* CUDA initialises (in CPU
   smoke mode instead: the CPU compatibility layer, loudly);
3. ``torch.distributed`` from the torchrun/SLURM environment, megatron's parallel groups sized from
   ``cfg.model`` (the single owner of parallel sizes), seeds;
4. :class:`Trainer` (``loop/trainer.py``), in named steps: build, resume, train, save on exit, report
   (``summary.json``).

The names Megatron-Bridge users import from here (``pretrain``, ``PretrainResult``, ``TrainState``,
``Trainer``) stay importable from this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from megatron.core import parallel_state

from megatron.bridge.training.devices.platform import select_platform
from megatron.bridge.training.gpt_step import forward_step as gpt_forward_step
from megatron.bridge.training.loop import initialize
from megatron.bridge.training.loop.checkpointing import TrainState
from megatron.bridge.training.loop.forward_step import check_forward_step
from megatron.bridge.training.loop.pretrain_arguments import checked_pretrain_arguments
from megatron.bridge.training.loop.run_description import resolved_config_text
from megatron.bridge.training.loop.teardown import free_memory
from megatron.bridge.training.loop.trainer import PretrainResult, Trainer
from megatron.bridge.training.loop.world import world_for
from megatron.bridge.utils.error_types import MachineError
from megatron.bridge.utils.gpu_count import too_few_gpus, visible_gpu_count

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["PretrainResult", "TrainState", "Trainer", "pretrain"]


def refuse_gpu_run_without_gpu(resolved: ConfigContainer) -> None:
    """A GPU config (``dist.device="cuda"``, the default) on a machine without a visible GPU stops
    here, in the harness's words, instead of in the driver on every rank."""
    have = visible_gpu_count() if resolved.dist.device == "cuda" else 1
    if have < 1:
        raise MachineError(
            f"{too_few_gpus(have, 1, 'dist.device=cuda: one GPU per rank')}. For the CPU smoke mode (gloo, any "
            'machine) set cfg.dist.device = "cpu" before pretrain(); otherwise run on a GPU machine '
            "(README: Your own training script)"
        )


def pretrain(
    config: ConfigContainer | None = None,
    forward_step_func: Callable[..., Any] | None = None,
    callbacks: Any = None,
    *,
    verbose: bool = False,
    cfg: ConfigContainer | None = None,
) -> PretrainResult:
    """Train ``config`` with megatron-core; returns the losses/step times (summary on rank 0).

    Megatron-Bridge's signature (``cfg=``: the older keyword of ``config``); what cannot work, callbacks
    among it, is refused before any work (``loop/pretrain_arguments.py``).
    SIGTERM/SIGINT stop the run between two steps (all ranks at the same iteration) and save once.
    ``verbose`` prints the full overlap report at start-up and every step's full line, not their brief forms.
    ``forward_step_func`` may take ``(data_iterator, model, return_schedule_plan=False)`` or, as in
    Megatron-Bridge, ``(state, data_iterator, model, return_schedule_plan=False)``.
    """
    cfg, forward_step_func = checked_pretrain_arguments(config, cfg, forward_step_func, callbacks)
    env = initialize.launch_env()
    world = world_for(cfg)  # real, or one rank of an emulated world: the loop asks it, never cfg.emulation
    world.check_launch(env.world_size)
    resolution = cfg.resolve(world_size=world.size_to_validate(env.world_size))  # once, before any group or CUDA work
    resolved, report = resolution.config, resolution.report
    refuse_gpu_run_without_gpu(resolved)
    platform = select_platform(resolved)
    platform.prepare_process(report)

    if forward_step_func is None:
        forward_step_func = gpt_forward_step
    check_forward_step(forward_step_func, ep_overlap=bool(resolved.comm_overlap.overlap_moe_expert_parallel_comm))

    created_group = not torch.distributed.is_initialized()
    env = initialize.initialize_distributed(resolved, world, env, platform)
    try:
        initialize.initialize_model_parallel(resolved, world)
        initialize.set_seeds(resolved, platform)
        config_text = resolved_config_text(resolution.effective)
        return Trainer(resolved, report, env, platform, world, forward_step_func, verbose, config_text).run()
    finally:
        parallel_state.destroy_model_parallel()
        if created_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            world.stop()
        free_memory()  # the trainer is gone: its model's memory is free when pretrain returns
