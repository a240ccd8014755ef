"""Where a run executes: GPUs (NCCL, or gloo on CUDA tensors) or CPU smoke mode, chosen once.

megatron-core assumes CUDA and NCCL. Every place where a run on CPU, or over gloo, must differ
from that (process-wide compatibility patches, device binding, seeding, moving the model, the
per-step synchronisation, optimizer kernels, the parameter re-gather after a gloo optimizer step,
what the data loader pins) is a method here, so the training loop reads the same on every machine
and the differences can be read in one place. :func:`select_platform` makes the choice from the
resolved config; ``pretrain`` makes it once and hands the object on.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from megatron.core import tensor_parallel

from megatron.bridge.training.devices import gloo_cuda_compat
from megatron.bridge.training.devices.offload_flag import offloaded_bytes, provide_offload_flag
from megatron.bridge.training.devices.torch_optimizer import use_torch_fast_paths

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.config_stages.resolution.overlap_report import OverlapReport

logger = logging.getLogger(__name__)


def set_cuda_device_max_connections(report: OverlapReport) -> str | None:
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


class Platform:
    """The device-dependent steps of a run; subclasses say what CUDA and CPU do."""

    device_type: str = ""
    uses_cuda: bool = False
    """Whether CUDA timing events, CUDA profiler activity and pinned host memory apply."""
    explicit_causal_mask: bool = False
    """Whether the data must carry a causal mask (megatron builds its default one on CUDA only)."""

    def __init__(self, resolved: ConfigContainer) -> None:
        self.backend = resolved.dist.effective_backend
        # Seen on CPU over gloo (megatron-core 0.19.2, torch 2.15): right after the distributed
        # optimizer's step, data-parallel replicas of a parameter can still differ (the param
        # all-gather inside the step is not yet visible); a synchronous re-gather makes them equal.
        self.resync_params = resolved.ddp.use_distributed_optimizer and self.backend == "gloo"
        self.te_rng_tracker = bool(resolved.rng.te_rng_tracker)
        # A captured graph must advance the RNG on the GPU (megatron-core's graph-safe tracker).
        self.graph_safe_rng = resolved.model.cuda_graph_impl not in (None, "none")
        self.activation_offload = bool(getattr(resolved.model, "fine_grained_activation_offloading", False))

    def prepare_process(self, report: OverlapReport) -> None:
        """Process-wide set-up before any process group or CUDA context exists."""
        raise NotImplementedError

    def bind_device(self, local_rank: int) -> None:
        """Make this rank's device current (before the process group is created)."""

    @property
    def device(self) -> torch.device:
        """The device this rank computes on (after :meth:`bind_device`)."""
        raise NotImplementedError

    def seed_model_parallel(self, seed: int) -> None:
        """Seed torch and megatron's model-parallel RNG tracker (parallel state must exist)."""
        raise NotImplementedError

    def place(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move a freshly built model chunk to this rank's device."""
        return module

    def synchronize(self) -> None:
        """Wait for the device's queued work (step boundaries of the timed loop)."""

    def start_run(self) -> None:
        """Per-run counters (a process may train several runs one after another)."""

    def fast_optimizer_kernels(self, optimizer: Any) -> str:
        """Switch the optimizer to the fastest kernels available here; the start-up line saying which."""
        raise NotImplementedError

    def activation_offload_record(self) -> dict[str, Any] | None:
        """What fine-grained activation offloading moved to host memory (``None`` when it is off)."""
        return offloaded_bytes() if self.activation_offload else None

    def after_optimizer_step(self, model: list[Any]) -> None:
        """Make data-parallel replicas of the parameters agree where the backend needs help."""
        if self.resync_params:
            for chunk in model:
                chunk.start_param_sync(force_sync=True)


class CudaPlatform(Platform):
    """GPUs: one device per rank (``LOCAL_RANK`` modulo the visible GPUs), NCCL or gloo."""

    device_type = "cuda"
    uses_cuda = True

    def prepare_process(self, report: OverlapReport) -> None:
        set_cuda_device_max_connections(report)
        if self.backend == "gloo":
            gloo_cuda_compat.enable_gloo_cuda_compat()
        if self.activation_offload:
            provide_offload_flag()

    def bind_device(self, local_rank: int) -> None:
        # Several ranks may share one GPU when the backend allows it (gloo).
        torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def seed_model_parallel(self, seed: int) -> None:
        torch.manual_seed(seed)
        # megatron-core keeps the first tracker of the process unless told to reset it: a run with
        # the graph after an eager run in one process would get the plain tracker and fail its
        # capture (seen on an H200: "expected a Generator, but got Tensor").
        tensor_parallel.model_parallel_cuda_manual_seed(
            seed,
            te_rng_tracker=self.te_rng_tracker,
            use_cudagraphable_rng=self.graph_safe_rng,
            force_reset_rng=True,
        )

    def place(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.cuda(torch.cuda.current_device())

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def start_run(self) -> None:
        torch.cuda.reset_peak_memory_stats()  # each run reports its own peak

    def fast_optimizer_kernels(self, optimizer: Any) -> str:
        return use_torch_fast_paths(optimizer)


class CpuPlatform(Platform):
    """CPU smoke mode: megatron-core's CUDA calls mapped to CPU, gloo, correctness only."""

    device_type = "cpu"
    explicit_causal_mask = True

    def prepare_process(self, report: OverlapReport) -> None:
        # Deferred: the CPU compatibility layer is never imported on GPU (see its docstring).
        from megatron.bridge.training.devices.cpu_compat import enable_cpu_compat

        enable_cpu_compat()

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def seed_model_parallel(self, seed: int) -> None:
        # Deferred, as in prepare_process().
        from megatron.bridge.training.devices.cpu_compat import seed_cpu_model_parallel

        seed_cpu_model_parallel(seed)

    def fast_optimizer_kernels(self, optimizer: Any) -> str:
        return "optimizer kernels: megatron-core's (CPU)"


def select_platform(resolved: ConfigContainer) -> Platform:
    """The platform ``resolved.dist.device`` names (``cuda`` or ``cpu``)."""
    return CpuPlatform(resolved) if resolved.dist.device == "cpu" else CudaPlatform(resolved)
