"""Rules for CUDA graphs (``model.cuda_graph_impl`` and its companions), as data.

This training loop captures one kind of graph: megatron-core's whole-iteration graph
(``cuda_graph_impl="full_iteration"``: the forward and backward of every micro-batch of a step, the
optimizer stays eager; see ``cuda_graphs.py``). A captured graph replays fixed kernels on fixed
buffers, so everything inside the step must run without the host reading a GPU value. The rules
below refuse, before launch, the settings under which the capture would fail at its first step or
the setting would have no effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.training.config_stages.facts.graph_capture import FULL_ITERATION, fresh_capture_iteration
from megatron.bridge.training.config_stages.rules.dispatch_rules import (
    sorted_dispatch_blockers,
    uses_torch_native_layers,
)
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

CAPTURED_IMPLS: tuple[str, ...] = ("none", FULL_ITERATION)
"""The ``model.cuda_graph_impl`` values this loop acts on (``none``: no graph)."""


def captures_full_iteration(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return cfg.model.cuda_graph_impl == FULL_ITERATION


def moe_step_is_sync_free(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Whether each MoE layer routes its tokens without the host reading a GPU value.

    True for dense models; for MoE, only the torch-native sorted dispatcher, exact for this layout:
    at EP=1 (``auto`` picks it) its permutation stays on the GPU; at EP > 1 only with the NVSHMEM
    exchange, asked for explicitly (``torch_native_dispatcher=sorted``,
    ``torch_native_ep_transport=nvshmem``; ``auto`` may fall back to a transport that reads split
    sizes on the host). megatron-core's dropless dispatcher reads the token counts on the host in
    every micro-batch, and its drop-and-pad mode (``moe_pad_expert_input_to_capacity``) copies a host
    tensor to the GPU inside the step, which a capture cannot hold.
    """
    m = cfg.model
    if not m.num_moe_experts:
        return True
    if not uses_torch_native_layers(cfg, ctx) or sorted_dispatch_blockers(cfg):
        return False
    if m.expert_model_parallel_size == 1:
        return m.torch_native_dispatcher != "megatron"
    return m.torch_native_dispatcher == "sorted" and m.torch_native_ep_transport == "nvshmem"


def _warmup_in_range(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    warmup = cfg.model.cuda_graph_warmup_steps
    return isinstance(warmup, int) and 1 <= warmup < cfg.train.train_iters


def _capture_outside_window(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """The capturing step (of a fresh run, as the run will count it) is not in the steady window."""
    window, capture = cfg.logger.steady_state_window, fresh_capture_iteration(cfg.model)
    if window is None or capture is None:  # the automatic window starts after the capture; no capture
        return True
    first, last = window
    return not first <= capture <= last


CUDA_GRAPH_RULES: tuple[Rule, ...] = (
    Rule(
        id="cuda-graph-impl-captured",
        fields=("model.cuda_graph_impl",),
        holds=lambda cfg, ctx: cfg.model.cuda_graph_impl in CAPTURED_IMPLS,
        message="this training loop captures megatron-core's whole-iteration graph only; per-layer graphs "
        "('local', 'transformer_engine') need capture calls this loop does not make, so the setting would "
        "be accepted and have no effect",
        fix="set model.cuda_graph_impl=full_iteration (--cuda_graph_impl full_iteration) or none",
        group="cuda-graph",
    ),
    Rule(
        id="optimizer-graph-not-captured",
        fields=("optimizer.optimizer_cuda_graph",),
        holds=lambda cfg, ctx: not cfg.optimizer.optimizer_cuda_graph,
        message="this training loop does not capture the optimizer step (megatron-core's own training wraps it "
        "in OptimizerCudaGraphWrapper; here the flag would only be handed to the optimizer and change nothing "
        "about launches)",
        fix="set optimizer.optimizer_cuda_graph=false; model.cuda_graph_impl=full_iteration captures the "
        "forward+backward",
        group="cuda-graph",
    ),
    Rule(
        id="full-iteration-graph-needs-cuda",
        fields=("model.cuda_graph_impl", "dist.device"),
        applies=captures_full_iteration,
        holds=lambda cfg, ctx: cfg.dist.device == "cuda",
        message="a CUDA graph needs CUDA; the CPU smoke mode has nothing to capture",
        fix="set model.cuda_graph_impl=none for CPU runs",
        group="cuda-graph",
    ),
    Rule(
        id="full-iteration-graph-sync-free-moe",
        fields=(
            "model.cuda_graph_impl",
            "model.expert_model_parallel_size",
            "model.layer_spec",
            "model.torch_native_dispatcher",
            "model.torch_native_ep_transport",
            "model.moe_expert_capacity_factor",
        ),
        applies=captures_full_iteration,
        holds=moe_step_is_sync_free,
        message="the captured step must route tokens without the host touching GPU values: megatron-core's "
        "dispatchers copy token counts to the host (dropless) or a host tensor to the GPU (drop-and-pad) in "
        "every micro-batch. Captured MoE steps run with the torch-native sorted dispatcher (exact: dropless, "
        "expert TP 1): at EP=1, and at EP > 1 over the NVSHMEM exchange, which keeps split sizes on the GPU",
        fix="use model.layer_spec=torch_native; at EP=1 model.torch_native_dispatcher=auto, at EP > 1 "
        "model.torch_native_dispatcher=sorted and model.torch_native_ep_transport=nvshmem; or set "
        "model.cuda_graph_impl=none",
        group="cuda-graph",
    ),
    Rule(
        id="full-iteration-graph-needs-nccl",
        fields=("model.cuda_graph_impl", "dist.distributed_backend"),
        applies=lambda cfg, ctx: (
            captures_full_iteration(cfg, ctx) and ctx.world_size is not None and ctx.world_size > 1
        ),
        holds=lambda cfg, ctx: cfg.dist.effective_backend == "nccl",
        message="with several ranks the captured step contains collectives: megatron's schedule reduces the "
        "gradients across data-parallel ranks (finalize_model_grads) inside the forward+backward it captures. "
        "NCCL's can be captured, gloo's run on the host and cannot (two ranks sharing an H200 over gloo failed "
        "their first capture with 'operation not permitted when stream is capturing' in reduce_scatter_tensor)",
        fix="run one process per GPU over NCCL (dist.distributed_backend=nccl; the harness picks gloo only "
        "with --procs_per_gpu > 1), or set model.cuda_graph_impl=none",
        extra_values=(("world_size", lambda ctx: ctx.world_size),),
        group="cuda-graph",
    ),
    Rule(
        id="full-iteration-graph-no-pipeline",
        fields=("model.cuda_graph_impl", "model.pipeline_model_parallel_size"),
        applies=captures_full_iteration,
        holds=lambda cfg, ctx: cfg.model.pipeline_model_parallel_size == 1,
        message="this loop captures the step of one pipeline stage only; pipeline-parallel capture (its "
        "point-to-point exchanges inside the graph) is not supported here",
        fix="set model.pipeline_model_parallel_size=1, or model.cuda_graph_impl=none",
        group="cuda-graph",
    ),
    Rule(
        id="full-iteration-graph-warmup-in-run",
        fields=("model.cuda_graph_impl", "model.cuda_graph_warmup_steps", "train.train_iters"),
        applies=captures_full_iteration,
        holds=_warmup_in_range,
        message="the graph is captured in the step after model.cuda_graph_warmup_steps eager steps; at least "
        "one eager step must come first (torch.compile and Triton pick their kernels there, which cannot "
        "happen during a capture), and with warm-up >= train.train_iters nothing would be captured",
        fix="set model.cuda_graph_warmup_steps between 1 and train.train_iters - 1 (e.g. 2)",
        group="cuda-graph",
    ),
    Rule(
        id="full-iteration-capture-outside-steady-window",
        fields=("model.cuda_graph_impl", "model.cuda_graph_warmup_steps", "logger.steady_state_window"),
        # a warm-up that is no step count is the rule above's to report; the automatic window starts after the capture
        applies=lambda cfg, ctx: (
            captures_full_iteration(cfg, ctx)
            and _warmup_in_range(cfg, ctx)
            and cfg.logger.steady_state_window is not None
        ),
        holds=_capture_outside_window,
        message="the step that captures the graph (iteration warm-up + 1) is slower than the others and "
        "falls inside the steady-state window, so the reported step time includes the capture",
        fix="start logger.steady_state_window after the capture, or lower model.cuda_graph_warmup_steps",
        severity="warning",
        group="cuda-graph",
    ),
)
"""Every CUDA-graph rule, in the order they are reported."""
