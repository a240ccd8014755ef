"""``pretrain(cfg)``: real megatron-core training of a GPT/MoE model, on GPUs or in CPU smoke mode.

Order of work, chosen so that mistakes cost seconds, not a cluster allocation:

1. ``cfg.validate()`` (every rule, no process group, no CUDA);
2. the overlap report; ``CUDA_DEVICE_MAX_CONNECTIONS`` from it, *before* CUDA initialises
   (in CPU smoke mode instead: the CPU compatibility layer, loudly);
3. ``torch.distributed`` from the torchrun/SLURM environment, megatron's parallel groups sized from
   ``cfg.model`` (the single owner of parallel sizes), seeds;
4. one model chunk per virtual pipeline stage, ``Float16Module``, megatron ``DistributedDataParallel``
   (``cfg.ddp``: ``delay_wgrad_compute``, ``overlap_grad_reduce`` passed through), megatron's
   optimizer, ``OptimizerParamScheduler``, ``finalize_model_grads``;
5. the loop over ``get_forward_backward_func()``: with ``overlap_moe_expert_parallel_comm`` the
   schedule is megatron's combined 1F1B (the forward step returns a schedule plan).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from megatron.bridge.training import initialize
from megatron.bridge.training.checkpointing import TrainState

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.overlap_report import OverlapReport

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Overlap report and CUDA_DEVICE_MAX_CONNECTIONS


def set_cuda_device_max_connections(report: "OverlapReport") -> Optional[str]:
    """Export ``CUDA_DEVICE_MAX_CONNECTIONS`` as the report asks; must run before CUDA initialises."""
    need = report.cuda_device_max_connections
    if need is None:
        return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if torch.cuda.is_initialized() and os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != str(need):
        logger.warning(
            "CUDA is already initialised; CUDA_DEVICE_MAX_CONNECTIONS=%s comes too late for this "
            "process (export it before starting Python).",
            need,
        )
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(need)
    return str(need)


# --------------------------------------------------------------------------------------------------
# Model, optimizer, scheduler


def build_model(resolved: "ConfigContainer") -> list[Any]:
    """One DDP-wrapped chunk per virtual pipeline stage of this rank."""
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.transformer.module import Float16Module

    m = resolved.model
    vpp = m.virtual_pipeline_model_parallel_size
    stages = [None] if vpp is None else list(range(vpp))
    chunks = []
    for vp_stage in stages:
        chunk = m.provide(vp_stage=vp_stage)
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        if resolved.dist.device == "cuda":
            chunk.cuda(torch.cuda.current_device())
        if m.fp16 or m.bf16:
            chunk = Float16Module(m, chunk)
        chunks.append(chunk)
    wrapped = [
        DistributedDataParallel(
            config=m,
            ddp_config=resolved.ddp,
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


def build_optimizer(resolved: "ConfigContainer", model: list[Any]) -> Any:
    """megatron-core's optimizer (distributed optimizer when ``optimizer.use_distributed_optimizer``)."""
    from megatron.core.optimizer import get_megatron_optimizer

    return get_megatron_optimizer(resolved.optimizer, model)


def build_scheduler(resolved: "ConfigContainer", optimizer: Any) -> Any:
    """``OptimizerParamScheduler`` stepped in samples (as megatron does), from ``cfg.scheduler``."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

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


def wire_model_config(resolved: "ConfigContainer", model: list[Any], optimizer: Any) -> None:
    """The hooks megatron's schedules call: grad scaling, no_sync/grad_sync, finalize_model_grads."""
    from megatron.core.distributed import finalize_model_grads

    config = resolved.model
    config.grad_scale_func = optimizer.scale_loss
    config.timers = None
    if resolved.ddp.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        if resolved.ddp.align_param_gather or len(model) == 1:
            grad_sync = [chunk.start_grad_sync for chunk in model]
            config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    if resolved.ddp.overlap_param_gather and resolved.ddp.align_param_gather:
        param_sync = [chunk.start_param_sync for chunk in model]
        config.param_sync_func = param_sync[0] if len(model) == 1 else param_sync
    config.finalize_model_grads_func = finalize_model_grads


def force_param_sync(model: list[Any]) -> None:
    """Synchronously all-gather the distributed optimizer's updated parameter shards (all chunks)."""
    for chunk in model:
        chunk.start_param_sync(force_sync=True)


# --------------------------------------------------------------------------------------------------
# The loop


@dataclass
class PretrainResult:
    """What ``pretrain`` returns on every rank (the summary only on the logging rank)."""

    state: TrainState
    losses: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    summary_path: Optional[str] = None
    stopped_by_signal: bool = False


class _Saver:
    """Saves each iteration at most once and remembers which checkpoint holds the current state.

    The state a run resumes from is already on disk, so a run that resumes and stops (or ends)
    without training writes nothing; a stop on a save-interval iteration saves that iteration once.
    """

    def __init__(self, resolved: "ConfigContainer", model: list[Any], optimizer: Any, scheduler: Any) -> None:
        self.resolved, self.model, self.optimizer, self.scheduler = resolved, model, optimizer, scheduler
        self.persisted_iteration = 0
        self.path: Optional[Any] = None

    def resume(self, announce: bool) -> TrainState:
        """Load ``checkpoint.load`` when it holds a checkpoint; say what the run starts from."""
        from megatron.bridge.training import checkpointing

        ckpt = self.resolved.checkpoint
        loaded = checkpointing.load_checkpoint(self.resolved, self.model, self.optimizer, self.scheduler) if ckpt.load else None
        if loaded is None:
            if announce and ckpt.load:
                print(f"[megatron.bridge] no checkpoint in {ckpt.load} yet: starting from iteration 0", flush=True)
            return TrainState()
        state, self.path = loaded
        self.persisted_iteration = state.iteration
        if announce:
            print(f"[megatron.bridge] resumed from iteration {state.iteration} ({self.path})", flush=True)
            if state.iteration >= self.resolved.train.train_iters:
                print(f"[megatron.bridge] nothing to train: train.train_iters={self.resolved.train.train_iters}", flush=True)
        return state

    def interval_due(self, iteration: int) -> bool:
        interval = self.resolved.checkpoint.save_interval
        return bool(interval) and iteration % interval == 0

    def exit_due(self, iteration: int) -> bool:
        return self.resolved.checkpoint.save_on_exit or self.interval_due(iteration)

    def save(self, state: TrainState) -> None:
        """Save ``state`` unless it is already on disk (or no save directory is set)."""
        from megatron.bridge.training import checkpointing

        if not self.resolved.checkpoint.save or state.iteration == self.persisted_iteration:
            return
        self.path = checkpointing.save_checkpoint(self.resolved, self.model, self.optimizer, self.scheduler, state)
        self.persisted_iteration = state.iteration


def _stop_reason(limit_min: Optional[float], start: float, device: torch.device) -> Optional[str]:
    """Why all ranks must stop now (a stop signal or ``train.exit_duration_in_mins`` on any rank),
    else ``None``. One small all-reduce per step, so every rank stops at the same iteration."""
    from megatron.bridge.training.stop_request import STOP

    out_of_time = bool(limit_min) and time.time() - start > 60.0 * limit_min
    flags = torch.tensor([STOP.signum or 0, int(out_of_time)], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    if flags[0]:
        return signal.Signals(int(flags[0])).name
    if flags[1]:
        return "exit_duration_in_mins reached"
    return None


def _reduce_loss(losses_reduced: list[dict], device: torch.device) -> float:
    """Per-token mean loss over all micro-batches and data-parallel ranks (stage-agnostic)."""
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for item in losses_reduced:
        if "lm loss" in item:
            total += item["lm loss"].to(device=device, dtype=torch.float64)
    # Non-last stages contribute zeros; TP/CP duplicates cancel in the ratio.
    torch.distributed.all_reduce(total)
    return float(total[0] / total[1].clamp(min=1.0))


def _moe_aux_losses(resolved: "ConfigContainer", num_microbatches: int, iteration: int) -> dict[str, float]:
    """megatron's MoE metrics tracker, reduced across ranks; empty for dense models."""
    m = resolved.model
    if not m.num_moe_experts:
        return {}
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    totals: dict[str, Any] = {}
    get_moe_metrics_tracker().report(
        loss_scale=1.0 / num_microbatches,
        iteration=iteration,
        total_loss_dict=totals,
        num_layers=m.num_layers,
        moe_layer_freq=m.moe_layer_freq,
        mtp_num_layers=m.mtp_num_layers,
    )
    return {k.replace(" ", "_"): float(v) for k, v in totals.items()}


def _device(resolved: "ConfigContainer") -> torch.device:
    if resolved.dist.device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _log_dir(resolved: "ConfigContainer") -> str:
    from megatron.bridge.training.metrics import default_log_dir

    return resolved.logger.log_dir or default_log_dir()


def _startup_lines(
    resolved: "ConfigContainer", report: Any, env: initialize.LaunchEnv, num_microbatches: int, verbose: bool
) -> list[str]:
    from megatron.core import parallel_state as ps

    from megatron.bridge.models.layer_specs import describe_layer_spec

    m = resolved.model
    return [
        f"launch: {env.launcher}, world size {torch.distributed.get_world_size()}, backend "
        f"{resolved.dist.effective_backend}, device {resolved.dist.device}",
        f"parallel layout: TP{m.tensor_model_parallel_size} PP{m.pipeline_model_parallel_size} "
        f"VPP{m.virtual_pipeline_model_parallel_size or '-'} CP{m.context_parallel_size} "
        f"EP{m.expert_model_parallel_size} ETP{m.expert_tensor_parallel_size} "
        f"DP{ps.get_data_parallel_world_size()}",
        f"batch: global {resolved.train.global_batch_size}, micro {resolved.train.micro_batch_size}, "
        f"{num_microbatches} micro-batches per step, seq {m.seq_length}",
        describe_layer_spec(m.layer_spec),
        m.describe_loss(resolved.dist.device),
        f"dispatcher: {m.moe_token_dispatcher_type}"
        + (f" (flex backend {m.moe_flex_dispatcher_backend})" if m.moe_token_dispatcher_type == "flex" else ""),
        f"schedule: {'combined 1F1B (EP overlap)' if m.overlap_moe_expert_parallel_comm else 'standard 1F1B'}",
        f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}",
        report.format(brief=not verbose),
    ]


def parallel_layout(resolved: "ConfigContainer") -> dict[str, Any]:
    """The layout and batch shape for ``summary.json`` (the sizes are those a checkpoint records)."""
    from megatron.core import parallel_state as ps

    from megatron.bridge.training.checkpointing import checkpoint_layout

    return dict(
        checkpoint_layout(resolved, ps.get_data_parallel_world_size()),
        micro_batch_size=resolved.train.micro_batch_size,
        global_batch_size=resolved.train.global_batch_size,
        seq_length=resolved.model.seq_length,
    )


_DISPATCHER_MODULE = "megatron.bridge.models.torch_native.dispatcher"


def moe_token_dispatch() -> list[dict[str, Any]]:
    """The token dispatchers the torch-native MoE layers of this process chose, and why."""
    module = sys.modules.get(_DISPATCHER_MODULE)
    if module is None:  # no torch-native MoE layer was built
        return []
    return [dict(c.to_dict(), description=c.describe()) for c in module.dispatch_choices()]


def _resolved_config_text(resolved: "ConfigContainer") -> Any:
    try:
        return resolved.to_yaml()
    except Exception as exc:  # the YAML writer is optional for training; keep the run going
        return f"<config could not be serialised: {exc}>"


def pretrain(
    cfg: "ConfigContainer", forward_step_func: Optional[Callable[..., Any]] = None, *, verbose: bool = False
) -> PretrainResult:
    """Train ``cfg`` with megatron-core; returns the losses/step times (summary on rank 0).

    SIGTERM/SIGINT stop the run between two steps (all ranks at the same iteration) and save once.
    ``verbose`` prints the full overlap report at start-up instead of its brief form.
    """
    env = initialize.launch_env()
    resolution = cfg.resolve(world_size=env.world_size)  # once, before any process group or CUDA work
    resolved, report = resolution.config, resolution.report
    if resolved.dist.device == "cpu":
        from megatron.bridge.training.cpu_compat import enable_cpu_compat

        enable_cpu_compat()
    else:
        set_cuda_device_max_connections(report)
        if resolved.dist.effective_backend == "gloo":
            from megatron.bridge.training.gloo_cuda_compat import enable_gloo_cuda_compat

            enable_gloo_cuda_compat()

    if forward_step_func is None:
        from megatron.bridge.training.gpt_step import forward_step as forward_step_func

    created_group = not torch.distributed.is_initialized()
    env = initialize.initialize_distributed(resolved, env)
    try:
        initialize.initialize_model_parallel(resolved)
        initialize.set_seeds(resolved)
        return _train(resolved, report, env, forward_step_func, verbose)
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if created_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _train(
    resolved: "ConfigContainer", report: Any, env: initialize.LaunchEnv, forward_step_func: Callable[..., Any],
    verbose: bool,
) -> PretrainResult:
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from megatron.bridge.training.data import build_train_iterator
    from megatron.bridge.training.flops import flops_per_step
    from megatron.bridge.training.metrics import MetricsLogger
    from megatron.bridge.training.profiling import StepProfiler
    from megatron.bridge.training.step_timing import StepTimer

    t = resolved.train
    dp = ps.get_data_parallel_world_size()
    num_microbatches = t.global_batch_size // (t.micro_batch_size * dp)
    rank = torch.distributed.get_rank()
    is_logging_rank = rank == 0
    device = _device(resolved)
    if is_logging_rank:
        for line in _startup_lines(resolved, report, env, num_microbatches, verbose):
            print(f"[megatron.bridge] {line}", flush=True)

    dispatcher_module = sys.modules.get(_DISPATCHER_MODULE)
    if dispatcher_module is not None:  # a model built earlier in this process recorded its choices
        dispatcher_module.forget_dispatch_choices()
    if device.type == "cuda":  # a process may train several runs: each reports its own peak
        torch.cuda.reset_peak_memory_stats()
    model = build_model(resolved)
    dispatch = moe_token_dispatch()
    if is_logging_rank:
        for choice in dispatch:
            print(f"[megatron.bridge] MoE token dispatch: {choice['description']}", flush=True)
    optimizer = build_optimizer(resolved, model)
    optimizer_kernels = "optimizer kernels: megatron-core's (CPU)"
    if resolved.dist.device == "cuda":
        from megatron.bridge.training.torch_optimizer import use_torch_fast_paths

        optimizer_kernels = use_torch_fast_paths(optimizer)
    if is_logging_rank:
        print(f"[megatron.bridge] {optimizer_kernels}", flush=True)
    scheduler = build_scheduler(resolved, optimizer)
    wire_model_config(resolved, model, optimizer)

    saver = _Saver(resolved, model, optimizer, scheduler)
    state = saver.resume(is_logging_rank)

    vpp = resolved.model.virtual_pipeline_model_parallel_size
    if vpp is None:
        data_iterator: Any = build_train_iterator(resolved, state.consumed_samples)
    else:
        data_iterator = [build_train_iterator(resolved, state.consumed_samples) for _ in range(vpp)]

    log_dir = _log_dir(resolved)
    seq = resolved.model.seq_length
    metrics = MetricsLogger(
        train_iters=t.train_iters,
        tokens_per_step=t.global_batch_size * seq,
        flops_per_step=flops_per_step(resolved.model, t.global_batch_size, seq),
        world_size=torch.distributed.get_world_size(),
        device=resolved.dist.device,
        log_dir=log_dir,
        steady_state_window=resolved.logger.steady_state_window,
        log_interval=resolved.logger.log_interval,
        is_logging_rank=is_logging_rank,
        tensorboard=resolved.logger.tensorboard,
        start_iteration=state.iteration,
    )
    forward_backward = get_forward_backward_func()
    for chunk in model:
        chunk.train()
    profiler = StepProfiler(resolved.profiling, rank, log_dir, use_cuda=resolved.dist.device == "cuda")
    timer = StepTimer(use_cuda=resolved.dist.device == "cuda")

    # Seen on CPU over gloo (megatron-core 0.19.2, torch 2.15): right after the distributed
    # optimizer's step, data-parallel replicas of a parameter can still differ (the param all-gather
    # inside the step is not yet visible); a synchronous re-gather makes them identical again.
    resync_params = resolved.ddp.use_distributed_optimizer and resolved.dist.effective_backend == "gloo"
    if t.manual_gc:
        gc.disable()
        gc.collect()
    train_start = time.time()
    from megatron.bridge.training.stop_request import STOP, STOP_SIGNAL_NAMES

    with STOP.listening():
        # A stop asked for during start-up ends the run before its first step.
        reason = _stop_reason(t.exit_duration_in_mins, train_start, device)
        while reason is None and state.iteration < t.train_iters:
            if resolved.dist.device == "cuda":
                torch.cuda.synchronize()
            profiler.before_step(state.iteration + 1)
            start = time.perf_counter()
            for chunk in model:
                chunk.zero_grad_buffer()
            optimizer.zero_grad()
            timer.start()
            losses_reduced = forward_backward(
                forward_step_func=forward_step_func,
                data_iterator=data_iterator,
                model=model,
                num_microbatches=num_microbatches,
                seq_length=seq,
                micro_batch_size=t.micro_batch_size,
                decoder_seq_length=seq,
                forward_only=False,
            )
            timer.forward_backward_launched()
            update_ok, grad_norm, _ = optimizer.step()
            if resync_params:
                force_param_sync(model)
            if update_ok:
                scheduler.step(increment=t.global_batch_size)
            if resolved.dist.device == "cuda":
                torch.cuda.synchronize()
            step_time = time.perf_counter() - start
            phases = timer.stop()
            state.iteration += 1
            trace = profiler.after_step(state.iteration)
            if trace is not None:
                print(f"[megatron.bridge] rank {rank}: profiler trace written to {trace}", flush=True)
            state.consumed_samples += t.global_batch_size
            loss = _reduce_loss(losses_reduced, device)
            scalars = dict(lr=float(optimizer.param_groups[0]["lr"]))
            if grad_norm is not None:
                scalars["grad_norm"] = float(grad_norm)
            scalars.update(phases)
            scalars.update(_moe_aux_losses(resolved, num_microbatches, state.iteration))
            metrics.record(state.iteration, loss, step_time, **scalars)

            if saver.interval_due(state.iteration):
                saver.save(state)
            if t.manual_gc and t.manual_gc_interval and state.iteration % t.manual_gc_interval == 0:
                gc.collect()
            reason = _stop_reason(t.exit_duration_in_mins, train_start, device)
        stop_signal = reason if reason in STOP_SIGNAL_NAMES else None
        if reason is not None and is_logging_rank:
            print(f"[megatron.bridge] {reason}: stopping at iteration {state.iteration}", flush=True)
        STOP.clear()
    profiler.close()
    if t.manual_gc:
        gc.enable()
    if saver.exit_due(state.iteration):
        saver.save(state)

    summary_path = metrics.write_summary(
        parallel_layout=parallel_layout(resolved),
        overlap_report=report.to_dict(),
        layer_spec=resolved.model.resolved_layer_spec,
        cuda_device_max_connections=os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        moe_token_dispatch=dispatch,
        optimizer_kernels=optimizer_kernels,
        num_microbatches=num_microbatches,
        start_iteration=metrics.start_iteration,
        final_iteration=state.iteration,
        stopped_by_signal=stop_signal is not None,
        stop_reason=reason,
        checkpoint=str(saver.path) if saver.path else None,
        resolved_config=_resolved_config_text(resolved),
    )
    torch.distributed.barrier()
    return PretrainResult(
        state=state,
        losses=list(metrics.losses),
        step_times_s=list(metrics.step_times_s),
        summary_path=str(summary_path) if summary_path else None,
        stopped_by_signal=stop_signal is not None,
    )
