"""The training loop of one run on this rank: :class:`Trainer`, in named steps.

*build* (model chunks, optimizer, scheduler: ``builders.py``), *resume* (checkpoint, data, metrics),
*train* (the loop over ``get_forward_backward_func()``; with ``overlap_moe_expert_parallel_comm`` the
schedule is megatron's combined 1F1B; with ``cuda_graph_impl="full_iteration"`` it is captured once
and replayed, ``devices/cuda_graphs.py``), *save* on exit, *report* (``summary.json``). Process
groups, megatron's parallel state and seeds exist before it is created
(``training/pretrain.py``'s ``pretrain()`` sets them up and hands it the resolved config).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.rerun_state_machine import get_rerun_state_machine

from megatron.bridge.models.dispatch.path_registry import prepare_dispatch
from megatron.bridge.models.torch_native.expert_rows import (
    STEP_PEAK,
    ExpertRowsOverflow,
    raise_for_expert_rows_overflow,
)
from megatron.bridge.training.devices.cuda_graphs import IterationGraph
from megatron.bridge.training.devices.platform import Platform
from megatron.bridge.training.loop import initialize
from megatron.bridge.training.loop.builders import (
    build_model,
    build_optimizer,
    build_scheduler,
    unwire_model_config,
    wire_model_config,
)
from megatron.bridge.training.loop.checkpointing import (
    CheckpointSaver,
    TrainState,
    hold_save_dir,
)
from megatron.bridge.training.loop.data import build_train_iterator
from megatron.bridge.training.loop.finite_state import (
    NonFiniteStateError,
    raise_for_nonfinite_loss,
    raise_for_nonfinite_parameters,
)
from megatron.bridge.training.loop.forward_step import (
    StepState,
    bind_forward_step,
)
from megatron.bridge.training.loop.grad_check import raise_for_nonfinite_grads
from megatron.bridge.training.loop.run_description import (
    log_dir_of,
    moe_token_dispatch,
    parallel_layout,
    startup_lines,
    wgrad_accumulation,
)
from megatron.bridge.training.loop.stop_request import STOP, STOP_SIGNAL_NAMES
from megatron.bridge.training.loop.teardown import drop_autograd_graphs, unhook_data_parallel
from megatron.bridge.training.telemetry.flops import flops_per_step
from megatron.bridge.training.telemetry.metrics import MetricsLogger, SteadyWindow, moe_aux_losses
from megatron.bridge.training.telemetry.profiling import StepProfiler
from megatron.bridge.training.telemetry.step_timing import StepTimer

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.loop.world import World


@dataclass
class PretrainResult:
    """What ``pretrain`` returns on every rank (the summary only on the logging rank)."""

    state: TrainState
    losses: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    summary_path: str | None = None
    stopped_by_signal: bool = False


# --------------------------------------------------------------------------------------------------
# Per-step helpers


def _say(line: str) -> None:
    print(f"[megatron.bridge] {line}", flush=True)


def _stop_reason(limit_min: float | None, start: float, device: torch.device) -> str | None:
    """Why all ranks must stop now (a stop signal or ``train.exit_duration_in_mins`` on any rank),
    else ``None``. One small all-reduce per step, so every rank stops at the same iteration."""

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


@contextlib.contextmanager
def _manual_gc(enabled: bool) -> Iterator[None]:
    """``train.manual_gc``: Python's collector off during the loop, collections at chosen steps."""
    if not enabled:
        yield
        return
    gc.disable()
    gc.collect()
    try:
        yield
    finally:
        gc.enable()


# --------------------------------------------------------------------------------------------------
# The training loop


class Trainer:
    """One run on this rank, in named steps: build, resume, train (step by step), save, report.

    Process groups, megatron's parallel state and seeds exist before it is created; everything
    that differs between GPUs and CPU smoke mode is asked of ``platform``, everything that differs
    between a real and an emulated world of ``world`` (``world.py``).
    """

    def __init__(
        self,
        resolved: ConfigContainer,
        report: Any,
        env: initialize.LaunchEnv,
        platform: Platform,
        world: World,
        forward_step_func: Callable[..., Any],
        verbose: bool,
        config_text: str,
    ) -> None:

        self.resolved, self.report, self.env, self.platform, self.world = resolved, report, env, platform, world
        self.config_text = config_text  # the effective config as YAML, for summary.json
        self.forward_step_func, self.verbose = forward_step_func, verbose
        t = resolved.train
        data_parallel = parallel_state.get_data_parallel_world_size()
        self.num_microbatches = t.global_batch_size // (t.micro_batch_size * data_parallel)
        self.rank = torch.distributed.get_rank()
        self.is_logging_rank = world.is_logging_rank(self.rank)
        self.device = platform.device
        self.state = TrainState()
        self.model: list = []  # model chunks, from build()
        self.parked_steps: list[dict[str, float]] = []  # profiling.gpu_park_steps, as measured
        self.graph = IterationGraph.from_model_config(resolved.model, resolved.ddp.check_for_nan_in_grad, world)
        self.save_lock, self.run_id = None, "run"  # hold_save_dir()
        self.grad_norm: float | None = None  # the last step's gradient norm, as logged

    def run(self) -> PretrainResult:
        """Every step of the run, in order; the result this rank returns."""
        self.announce()
        try:
            self.hold_save_dir()
            self.build()
            self.resume()
            try:
                reason = self.train()
                self.save_on_exit()
            except (NonFiniteStateError, ExpertRowsOverflow) as exc:
                # summary.json says why before the error ends the run
                self.finish(str(exc), nonfinite=exc if isinstance(exc, NonFiniteStateError) else None)
                raise
            return self.finish(reason)
        finally:
            self.release()

    def release(self) -> None:
        """Let go of the model and optimizer (also after an error), so a later run has the memory."""

        drop_autograd_graphs(self.model)
        unhook_data_parallel(self.model)
        unwire_model_config(self.resolved)
        self.graph.release()
        if self.save_lock is not None:
            self.save_lock.release()
            self.save_lock = None
        self.model, self.optimizer, self.scheduler, self.saver = [], None, None, None

    # ---------------------------------------------------------------- build

    def hold_save_dir(self) -> None:
        """``checkpoint.save`` for this run alone (a lock file until the run ends; see ``save_lock.py``)."""

        self.save_lock, self.run_id = hold_save_dir(self.resolved, self.device)

    def announce(self) -> None:
        """The start-up lines: launch, layout, batch, layers, loss, dispatcher, schedule, CUDA graph, overlap."""
        if self.is_logging_rank:
            for line in self.world.startup_lines():
                _say(line)
            for line in startup_lines(
                self.resolved,
                self.report,
                self.env,
                self.num_microbatches,
                self.verbose,
                cuda_graph=self.graph.describe(),
            ):
                _say(line)

    def build(self) -> None:
        """Model chunks, optimizer (fastest kernels here), scheduler and megatron's schedule hooks."""

        self.platform.start_run()
        with self.graph.model_build_stream():
            self.model = build_model(self.resolved, self.platform, self.graph.ddp_config(self.resolved.ddp))
        self.dispatch = moe_token_dispatch(self.resolved, self.model)
        self.dispatch_changes = prepare_dispatch(self.resolved.model, [c["dispatcher"] for c in self.dispatch])
        STEP_PEAK.reset()
        self.wgrad_accumulation = wgrad_accumulation(self.resolved, self.model)
        if self.is_logging_rank:
            for choice in self.dispatch:
                _say(f"MoE token dispatch: {choice['description']}")
            for line in self.dispatch_changes:
                _say(line)
            for how in filter(None, self.wgrad_accumulation.values()):
                _say(how["description"])
        self.optimizer = build_optimizer(self.resolved, self.model, self.world)
        self.optimizer_kernels = self.platform.fast_optimizer_kernels(self.optimizer)
        if self.is_logging_rank:
            _say(self.optimizer_kernels)
        self.scheduler = build_scheduler(self.resolved, self.optimizer)
        wire_model_config(self.resolved, self.model, self.optimizer)
        self.saver = CheckpointSaver(self.resolved, self.model, self.optimizer, self.scheduler, run_id=self.run_id)

    # ---------------------------------------------------------------- resume

    def resume(self) -> None:
        """The checkpoint's state (if any), then data, metrics, profiler and timer from there."""

        self.state = self.saver.resume(self.is_logging_rank)
        self.data_iterator = self._data_iterator()
        log_dir = log_dir_of(self.resolved)
        self.metrics = self._metrics(log_dir)
        self.forward_backward = self.graph.wrap(get_forward_backward_func(), first_iteration=self.state.iteration + 1)
        for chunk in self.model:
            chunk.train()
        uses_cuda = self.platform.uses_cuda
        self.profiler = StepProfiler(self.resolved.profiling, self.rank, log_dir, use_cuda=uses_cuda)
        self.timer = StepTimer(use_cuda=uses_cuda)
        self.world.begin_steps()  # what building and loading issued is not a step's

    def _data_iterator(self) -> Any:
        """This rank's micro-batches from ``consumed_samples`` on; one iterator per virtual stage."""

        vpp = self.resolved.model.virtual_pipeline_model_parallel_size
        consumed = self.state.consumed_samples
        if vpp is None:
            return build_train_iterator(self.resolved, consumed, self.platform)
        return [build_train_iterator(self.resolved, consumed, self.platform) for _ in range(vpp)]

    def _metrics(self, log_dir: str) -> Any:
        t, seq = self.resolved.train, self.resolved.model.seq_length
        return MetricsLogger(
            train_iters=t.train_iters,
            tokens_per_step=t.global_batch_size * seq,
            flops_per_step=flops_per_step(self.resolved.model, t.global_batch_size, seq),
            world_size=torch.distributed.get_world_size(),
            device=self.platform.device_type,
            log_dir=log_dir,
            steady_state_window=SteadyWindow.of_run(self.resolved, self.state.iteration),
            log_interval=self.resolved.logger.log_interval,
            is_logging_rank=self.is_logging_rank,
            tensorboard=self.resolved.logger.tensorboard or self.resolved.logger.tensorboard_dir is not None,
            tensorboard_dir=self.resolved.logger.tensorboard_dir,
            start_iteration=self.state.iteration,
            verbose=self.verbose,
        )

    # ---------------------------------------------------------------- train

    def train(self) -> str | None:
        """Steps until ``train.train_iters`` or a stop; the stop's reason (``None``: ran to the end)."""

        t = self.resolved.train
        with _manual_gc(t.manual_gc):
            start = time.time()
            with STOP.listening():
                # A stop asked for during start-up ends the run before its first step.
                reason = _stop_reason(t.exit_duration_in_mins, start, self.device)
                while reason is None and self.state.iteration < t.train_iters:
                    self.train_step()
                    self.after_step()
                    reason = _stop_reason(t.exit_duration_in_mins, start, self.device)
                if reason is not None and self.is_logging_rank:
                    _say(f"{reason}: stopping at iteration {self.state.iteration}")
                STOP.clear()
            self._say_written(self.profiler.close(self.state.iteration))
        return reason

    def _say_written(self, profiles: list[Path]) -> None:
        for path in profiles:
            what = "host profile" if path.name.startswith("host_") else "profiler trace"
            print(f"[megatron.bridge] rank {self.rank}: {what} written to {path}", flush=True)

    def train_step(self) -> None:
        """One optimizer step over ``num_microbatches`` micro-batches, timed and recorded."""

        # megatron's checks (DDP's NaN check among them) name the iteration from its rerun state
        # machine, which counts from 0 internally and shows one more: the step about to run.
        get_rerun_state_machine().current_iteration = self.state.iteration
        self.platform.synchronize()
        self.profiler.before_step(self.state.iteration + 1)
        start = time.perf_counter()
        losses_reduced, grad_norm = self._forward_backward_and_update()
        self.platform.synchronize()
        step_time = time.perf_counter() - start
        phases = self.timer.stop()
        self.state.iteration += 1
        self._say_written(self.profiler.after_step(self.state.iteration))
        self.state.consumed_samples += self.resolved.train.global_batch_size
        loss = _reduce_loss(losses_reduced, self.device)  # the same value on every rank
        self._record(loss, step_time, grad_norm, phases)
        raise_for_nonfinite_loss(loss, self.state.iteration, self.saver.path)

    def _forward_backward_and_update(self) -> tuple[list[dict], Any]:
        """megatron's schedule over the micro-batches, then the optimizer and scheduler step."""
        t, seq = self.resolved.train, self.resolved.model.seq_length
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        prof = self.resolved.profiling
        self.timer.start(park_s=prof.gpu_park_s if self.state.iteration + 1 in prof.gpu_park_steps else 0.0)
        losses_reduced = self.forward_backward(
            forward_step_func=bind_forward_step(self.forward_step_func, StepState(self.resolved, self.state)),
            data_iterator=self.data_iterator,
            model=self.model,
            num_microbatches=self.num_microbatches,
            seq_length=seq,
            micro_batch_size=t.micro_batch_size,
            decoder_seq_length=seq,
            forward_only=False,
        )
        self.timer.forward_backward_launched()
        if self.graph.checks_grads_after_backward:
            raise_for_nonfinite_grads(self.model, self.state.iteration + 1)
        raise_for_expert_rows_overflow(self.state.iteration + 1)
        update_ok, grad_norm, _ = self.optimizer.step()
        self.platform.after_optimizer_step(self.model)
        if update_ok:
            self.scheduler.step(increment=t.global_batch_size)
        return losses_reduced, grad_norm

    def _record(self, loss: float, step_time: float, grad_norm: Any, phases: dict[str, float]) -> None:
        scalars = dict(lr=float(self.optimizer.param_groups[0]["lr"]))
        self.grad_norm = float(grad_norm) if grad_norm is not None else None  # this step's, for a refused save
        if self.grad_norm is not None:
            scalars["grad_norm"] = self.grad_norm
        if "gpu_work_s" in phases:  # a parked step: kept apart, its step time is not a training speed
            self.parked_steps.append(dict(iteration=self.state.iteration, **phases))
            phases = {k: v for k, v in phases.items() if k not in ("gpu_parked_s", "gpu_work_s")}
        scalars.update(phases)
        scalars.update(moe_aux_losses(self.resolved.model, self.num_microbatches, self.state.iteration))
        scalars.update(self.world.end_step(self.state.iteration))
        self.metrics.record(self.state.iteration, loss, step_time, **scalars)

    def after_step(self) -> None:
        """Checkpoint on the save interval; a garbage collection on ``train.manual_gc_interval``."""
        t, iteration = self.resolved.train, self.state.iteration
        if self.save_lock is not None:
            self.save_lock.refresh()
        if self.saver.interval_due(iteration):
            self.save()
        if t.manual_gc and t.manual_gc_interval and iteration % t.manual_gc_interval == 0:
            gc.collect()

    # ---------------------------------------------------------------- save and report

    def save(self) -> None:
        """Save the current state, unless it is on disk already; a state with a NaN or Inf parameter
        is never saved: the run stops instead (``finite_state.py``), the previous checkpoint stays."""
        if self.resolved.checkpoint.save and self.state.iteration != self.saver.persisted_iteration:
            raise_for_nonfinite_parameters(
                self.model, self.state.iteration, self.device, self.saver.path, self.grad_norm
            )
        self.saver.save(self.state)

    def save_on_exit(self) -> None:
        """``checkpoint.save_on_exit`` (or a save-interval iteration): the final state, once."""
        if self.saver.exit_due(self.state.iteration):
            self.save()

    def finish(self, reason: str | None, nonfinite: NonFiniteStateError | None = None) -> PretrainResult:
        """``summary.json`` (logging rank), a barrier, and what ``pretrain`` returns; ``nonfinite``:
        the NaN or Inf that stopped the run, recorded as ``stopped_on_nonfinite``."""

        stopped_by_signal = reason in STOP_SIGNAL_NAMES
        summary_path = self.metrics.write_summary(
            parallel_layout=parallel_layout(self.resolved),
            overlap_report=self.report.to_dict(),
            layer_spec=self.report.layer_spec,
            layer_spec_reason=self.report.layer_spec_reason,
            gradient_accumulation_fusion=dict(
                enabled=bool(self.resolved.model.gradient_accumulation_fusion),
                description=self.resolved.model.describe_gradient_accumulation_fusion(self.platform.device_type),
            ),
            torch_native_kernels=self.resolved.model.torch_native_kernels(),
            cuda_device_max_connections=os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            moe_token_dispatch=self.dispatch,
            moe_dispatch_changes=self.dispatch_changes,
            **self.wgrad_accumulation,
            gpu_parked_steps=self.parked_steps,
            cuda_graph=self.graph.summary(self.state.iteration),
            optimizer_kernels=self.optimizer_kernels,
            activation_offload=self.platform.activation_offload_record(),
            num_microbatches=self.num_microbatches,
            start_iteration=self.metrics.start_iteration,
            final_iteration=self.state.iteration,
            stopped_by_signal=stopped_by_signal,
            stop_reason=reason,
            stopped_on_nonfinite=nonfinite.record() if nonfinite is not None else None,
            checkpoint=str(self.saver.path) if self.saver.path else None,
            resolved_config=self.config_text,
            emulation=self.world.summary(),
        )
        torch.distributed.barrier()
        return PretrainResult(
            state=self.state,
            losses=list(self.metrics.losses),
            step_times_s=list(self.metrics.step_times_s),
            summary_path=str(summary_path) if summary_path else None,
            stopped_by_signal=stopped_by_signal,
        )
