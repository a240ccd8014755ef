"""What a run says about itself: the start-up lines, and the layout, dispatch and weight-gradient
facts that ``summary.json`` records (read from the built model and the resolved configuration)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from megatron.core import parallel_state as ps

from megatron.bridge.models.dispatch.path_registry import describe_dispatcher
from megatron.bridge.models.torch_native.linear import dense_wgrad_accumulation
from megatron.bridge.training.config_stages.facts.checkpoint_dir import checkpoint_layout
from megatron.bridge.training.loop import initialize
from megatron.bridge.training.telemetry.metrics import default_log_dir

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def log_dir_of(resolved: ConfigContainer) -> str:
    return resolved.logger.log_dir or default_log_dir()


def startup_lines(
    resolved: ConfigContainer,
    report: Any,
    env: initialize.LaunchEnv,
    num_microbatches: int,
    verbose: bool,
    cuda_graph: str,
) -> list[str]:
    m = resolved.model
    kernels = [m.describe_torch_native_kernels()] if m.resolved_layer_spec == "torch_native" else []
    return [
        f"launch: {env.launcher}, world size {torch.distributed.get_world_size()}, backend "
        f"{resolved.dist.effective_backend}, device {resolved.dist.device}",
        f"parallel layout: TP{m.tensor_model_parallel_size} PP{m.pipeline_model_parallel_size} "
        f"VPP{m.virtual_pipeline_model_parallel_size or '-'} CP{m.context_parallel_size} "
        f"EP{m.expert_model_parallel_size} ETP{m.expert_tensor_parallel_size} "
        f"DP{ps.get_data_parallel_world_size()}",
        f"batch: global {resolved.train.global_batch_size}, micro {resolved.train.micro_batch_size}, "
        f"{num_microbatches} micro-batches per step, seq {m.seq_length}",
        report.layer_spec_line,
        *kernels,
        m.describe_loss(resolved.dist.device),
        *filter(None, [m.describe_gradient_accumulation_fusion(resolved.dist.device)]),
        f"dispatcher: {describe_dispatcher(m)}",
        f"schedule: {'combined 1F1B (EP overlap)' if m.overlap_moe_expert_parallel_comm else 'standard 1F1B'}",
        cuda_graph,
        f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}",
        report.format(brief=not verbose),
    ]


def parallel_layout(resolved: ConfigContainer) -> dict[str, Any]:
    """The layout and batch shape for ``summary.json`` (the sizes are those a checkpoint records)."""
    return dict(
        checkpoint_layout(resolved, ps.get_data_parallel_world_size()),
        micro_batch_size=resolved.train.micro_batch_size,
        global_batch_size=resolved.train.global_batch_size,
        seq_length=resolved.model.seq_length,
    )


def moe_token_dispatch(resolved: ConfigContainer, model: list) -> list[dict[str, Any]]:
    """The token dispatchers the torch-native MoE layers of ``model`` chose, and why."""
    if resolved.model.resolved_layer_spec != "torch_native":
        return []
    # Deferred: the torch-native MoE layers (megatron-core's MoE code) are loaded only for a model
    # built from them.
    from megatron.bridge.models.torch_native.moe_layer import dispatch_choices

    return [dict(c.to_dict(), description=c.describe()) for c in dispatch_choices(model)]


def wgrad_accumulation(resolved: ConfigContainer, model: list) -> dict[str, dict[str, Any] | None]:
    """How the torch-native layers' weight gradients reach DDP's main_grad, per kind of layer (read
    from the built parameters; ``None`` for a model of megatron's layer specs)."""
    if resolved.model.resolved_layer_spec != "torch_native":
        return {"expert_wgrad_accumulation": None, "dense_wgrad_accumulation": None}
    from megatron.bridge.models.torch_native.experts import expert_wgrad_accumulation  # as in moe_token_dispatch

    return {
        "expert_wgrad_accumulation": expert_wgrad_accumulation(model),
        "dense_wgrad_accumulation": dense_wgrad_accumulation(model),
    }


def resolved_config_text(effective: ConfigContainer) -> str:
    """The effective config as YAML (the finalized one holds megatron's callables and cannot be written)."""
    try:
        return effective.to_yaml()
    except Exception as exc:  # the YAML writer is optional for training; keep the run going
        return f"<config could not be serialised: {exc}>"
