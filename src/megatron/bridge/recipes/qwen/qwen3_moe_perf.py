"""Qwen3-MoE performance benchmark recipes, named as Megatron-Bridge names them.

Naming: ``{model}_{size}_{task}_{num_gpus}gpu_{gpu}_{precision}_config``. Each function starts from
the library recipe, sets the benchmark's layout, dispatcher and overlap, and returns a new
``ConfigContainer`` validated for its GPU type (``dist.target_gpu``): ``cfg.validate(world_size=16)``
checks it against that GPU, with or without one present.

The Qwen3-30B-A3B BF16 configurations run EP16 on 16 GPUs with megatron-core's ``alltoall``
dispatcher and EP overlap on (delayed weight gradients and shared-expert overlap off): the same
run as the harness's EP-overlap command on ``-g h100`` / ``-g h200``, with the benchmark's run
length instead of ``--max_steps``.
"""

from __future__ import annotations

from megatron.bridge.recipes.qwen.qwen3_moe import qwen3_30b_a3b_pretrain_config, written_for_gpus
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.flex_dispatcher_backend import dispatcher_fields

BENCHMARK_TRAIN_ITERS = 50
"""Iterations of a benchmark run: enough for a steady-state window after the warm-up steps."""
BENCHMARK_WARMUP_ITERS = 10
BENCHMARK_LOG_INTERVAL = 1
"""Every step is logged: the step times are the measurement."""


def _benchmark_run(cfg: ConfigContainer) -> ConfigContainer:
    """Throughput-measurement values: a short run, every step logged, no checkpoints, no NaN scan.

    The learning-rate schedule is written for the short run (decay over all of it, a short
    warm-up), so a benchmark step sees the same kind of schedule a long run does.
    """
    cfg.train.train_iters = BENCHMARK_TRAIN_ITERS
    cfg.train.eval_iters = 0
    cfg.scheduler.lr_warmup_iters = BENCHMARK_WARMUP_ITERS
    cfg.scheduler.lr_decay_iters = BENCHMARK_TRAIN_ITERS
    cfg.checkpoint.save = None
    cfg.checkpoint.load = None
    cfg.logger.log_interval = BENCHMARK_LOG_INTERVAL
    cfg.ddp.check_for_nan_in_grad = False
    return cfg


def _qwen3_30b_a3b_ep16_overlap_bf16(target_gpu: str) -> ConfigContainer:
    """Qwen3-30B-A3B, EP16 on 16 GPUs of type ``target_gpu``, BF16, EP overlap on.

    Dispatcher: plain ``alltoall`` (no flex backend); delayed weight-gradient compute and
    shared-expert overlap off; eager execution (no CUDA graphs); ``NullTokenizer`` on mock data.
    """
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.dist.target_gpu = target_gpu
    cfg.mixed_precision = "bf16_mixed"
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    model = cfg.model
    model.tensor_model_parallel_size = 1
    model.pipeline_model_parallel_size = 1
    model.virtual_pipeline_model_parallel_size = None
    model.context_parallel_size = 1
    model.expert_model_parallel_size = 16
    model.expert_tensor_parallel_size = 1
    model.sequence_parallel = False
    model.cuda_graph_impl = "none"
    for name, value in dispatcher_fields(None).items():
        setattr(model, name, value)
    model.moe_shared_expert_overlap = False
    cfg.train.global_batch_size = 1024
    cfg.train.micro_batch_size = 1
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    cfg.comm_overlap.delay_wgrad_compute = False
    return _benchmark_run(cfg)


@written_for_gpus(16)
def qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config() -> ConfigContainer:
    """Qwen3-30B-A3B pretraining benchmark: 16x H100, BF16, EP16, ``alltoall`` with EP overlap on."""
    return _qwen3_30b_a3b_ep16_overlap_bf16("h100")


@written_for_gpus(16)
def qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3-30B-A3B pretraining benchmark: 16x H200, BF16, EP16, ``alltoall`` with EP overlap on."""
    return _qwen3_30b_a3b_ep16_overlap_bf16("h200")


__all__ = [
    "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
    "qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config",
]
