"""Qwen3-MoE pretraining recipes on mock data.

Every recipe states its dispatcher (plain ``alltoall``, no flex backend) and carries a real
``CommOverlapConfig`` whose switches are left unset, as Megatron-Bridge's recipes leave them (unset
means "the framework decides": EP overlap and delayed weight gradients stay off unless requested):
turn EP overlap on with ``cfg.comm_overlap.overlap_moe_expert_parallel_comm = True`` or the matching
dotted override. ``cfg.dataset.seq_length`` holds the model's sequence length, which owns it: a
change of ``cfg.model.seq_length`` carries over to it when the config is validated.

The published-model recipes train with Megatron-Bridge's pretraining values (run length, warm-up,
weight-decay schedule, Adam epsilon, manual garbage collection); the values that need an optional
package (a Hugging Face tokenizer download, DeepEP/HybridEP, Transformer Engine kernels) are left
at what runs without it. ``docs/compatibility.md`` lists each difference.

Called without arguments a recipe is as written here; Megatron-Bridge's earlier keyword arguments
(``mock=True``, ``train_iters=...``, ``tensor_model_parallel_size=...``, ``dir=...``) are applied to
the fields they stand for or refused with the reason (``recipes/recipe_arguments.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.models.qwen import (
    Qwen3MoEModelProvider,
    Qwen3MoEModelProvider30B_A3B,
    Qwen3MoEModelProvider235B_A22B,
)
from megatron.bridge.recipes.recipe_arguments import RECIPE_WARMUP_ITERS, takes_upstream_arguments
from megatron.bridge.training.comm_overlap import CommOverlapConfig
from megatron.bridge.training.config import (
    CheckpointConfig,
    ConfigContainer,
    DatasetConfig,
    LoggerConfig,
    RNGConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainingConfig,
)
from megatron.bridge.training.config_stages.facts.ownership import write_following_copies

RecipeFn = TypeVar("RecipeFn", bound=Callable[[], ConfigContainer])

UPSTREAM_WEIGHT_DECAY = 0.033
"""Megatron-Bridge's pretraining weight decay, held constant by the scheduler (start = end)."""
UPSTREAM_ADAM_EPS = 1e-5
UPSTREAM_MANUAL_GC_INTERVAL = 100


def written_for_gpus(num_gpus: int) -> Callable[[RecipeFn], RecipeFn]:
    """Record the GPU count a recipe's layout and global batch are written for.

    The perf harness scales the global batch with the data-parallel size relative to this count.
    """

    def mark(recipe: RecipeFn) -> RecipeFn:
        recipe.reference_num_gpus = num_gpus
        return recipe

    return mark


def _pretrain_config(
    model: GPTModelProvider,
    *,
    global_batch_size: int,
    micro_batch_size: int = 1,
    train_iters: int = 300_000,
    lr: float = 3e-4,
    min_lr: float = 3e-5,
    lr_warmup_iters: int = RECIPE_WARMUP_ITERS,
) -> ConfigContainer:
    """Shared pretraining defaults: Adam, cosine decay, distributed optimizer, mock data; the
    dataset's sequence length written from the model's (its owner)."""
    cfg = ConfigContainer(
        model=model,
        train=TrainingConfig(
            train_iters=train_iters,
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
        ),
        optimizer=OptimizerConfig(
            optimizer="adam",
            lr=lr,
            min_lr=min_lr,
            weight_decay=0.1,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_eps=1e-8,
            clip_grad=1.0,
            use_distributed_optimizer=True,
        ),
        # Warm-up and decay are written for this run length; the harness scales both when
        # --max_steps changes it (perf.config_builder.schedule_values) and says so.
        scheduler=SchedulerConfig(
            lr_decay_style="cosine",
            lr_warmup_iters=min(lr_warmup_iters, train_iters // 10),
            lr_decay_iters=train_iters,
        ),
        ddp=DistributedDataParallelConfig(
            check_for_nan_in_grad=True,
            use_distributed_optimizer=True,
            average_in_collective=True,
        ),
        dataset=DatasetConfig(),
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer"),
        logger=LoggerConfig(),
        checkpoint=CheckpointConfig(),
        rng=RNGConfig(seed=1234),
        mixed_precision="bf16_mixed",
        comm_overlap=CommOverlapConfig(),
    )
    write_following_copies(cfg)
    return cfg


def _upstream_training_values(cfg: ConfigContainer) -> ConfigContainer:
    """Megatron-Bridge's pretraining values for the published models, on fields both projects have.

    The scheduler holds weight decay constant at ``UPSTREAM_WEIGHT_DECAY`` (it overrides
    ``optimizer.weight_decay`` at every step); Python's collector runs every
    ``UPSTREAM_MANUAL_GC_INTERVAL`` iterations instead of at random points.
    """
    cfg.scheduler.start_weight_decay = UPSTREAM_WEIGHT_DECAY
    cfg.scheduler.end_weight_decay = UPSTREAM_WEIGHT_DECAY
    cfg.scheduler.weight_decay_incr_style = "constant"
    cfg.optimizer.adam_eps = UPSTREAM_ADAM_EPS
    cfg.train.manual_gc = True
    cfg.train.manual_gc_interval = UPSTREAM_MANUAL_GC_INTERVAL
    return cfg


def _layout(
    model: GPTModelProvider,
    *,
    tp: int,
    pp: int,
    ep: int,
    cp: int = 1,
    vpp: int | None = None,
    etp: int = 1,
) -> GPTModelProvider:
    """Set the parallel layout on the model (the single owner of parallel sizes)."""
    model.tensor_model_parallel_size = tp
    model.pipeline_model_parallel_size = pp
    model.virtual_pipeline_model_parallel_size = vpp
    model.context_parallel_size = cp
    model.expert_model_parallel_size = ep
    model.expert_tensor_parallel_size = etp
    model.sequence_parallel = tp > 1
    return model


def _alltoall(model: GPTModelProvider) -> GPTModelProvider:
    """State the dispatcher explicitly: megatron-core's alltoall, no flex backend, no shared overlap."""
    model.moe_token_dispatcher_type = "alltoall"
    model.moe_flex_dispatcher_backend = None
    model.moe_shared_expert_overlap = False
    return model


@written_for_gpus(16)
@takes_upstream_arguments(hf_path="Qwen/Qwen3-30B-A3B")
def qwen3_30b_a3b_pretrain_config() -> ConfigContainer:
    """Qwen3-30B-A3B on 16 GPUs: TP1/PP1/EP16, GBS 1024, MBS 1, seq 4096."""
    model = _alltoall(_layout(Qwen3MoEModelProvider30B_A3B(), tp=1, pp=1, ep=16))
    return _upstream_training_values(_pretrain_config(model, global_batch_size=1024))


@written_for_gpus(8)
@takes_upstream_arguments(hf_path="Qwen/Qwen3-30B-A3B")
def qwen3_30b_a3b_pretrain_8gpu_config() -> ConfigContainer:
    """Qwen3-30B-A3B on 8 GPUs: TP4/PP2/EP4 (sequence parallel on), GBS 1024, MBS 1, seq 4096."""
    model = _alltoall(_layout(Qwen3MoEModelProvider30B_A3B(), tp=4, pp=2, ep=4))
    return _upstream_training_values(_pretrain_config(model, global_batch_size=1024))


@written_for_gpus(256)
@takes_upstream_arguments(hf_path="Qwen/Qwen3-235B-A22B")
def qwen3_235b_a22b_pretrain_config() -> ConfigContainer:
    """Qwen3-235B-A22B on 256 GPUs: TP4/PP16/CP2/EP8, GBS 1024, MBS 1, seq 4096.

    94 layers plus the embedding and loss stages split evenly into 16 pipeline stages.
    """
    model = _alltoall(_layout(Qwen3MoEModelProvider235B_A22B(), tp=4, pp=16, cp=2, ep=8))
    model.account_for_embedding_in_pipeline_split = True
    model.account_for_loss_in_pipeline_split = True
    return _upstream_training_values(_pretrain_config(model, global_batch_size=1024, lr=1e-4, min_lr=1e-5))


@written_for_gpus(1)
@takes_upstream_arguments(hf_path=None)
def qwen3_moe_tiny_pretrain_config() -> ConfigContainer:
    """A 2-layer Qwen3-MoE-shaped model (hidden 128, 8 experts top-2, vocab 1024, seq 128).

    Sized for CPU smoke runs and tests; layout TP1/PP1/EP1, GBS 8, MBS 1, 10 iterations.
    """
    model = Qwen3MoEModelProvider(
        num_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=32,
        ffn_hidden_size=256,
        moe_ffn_hidden_size=64,
        num_moe_experts=8,
        moe_router_topk=2,
        vocab_size=1024,
        seq_length=128,
        make_vocab_size_divisible_by=128,
    )
    model = _alltoall(_layout(model, tp=1, pp=1, ep=1))
    cfg = _pretrain_config(model, global_batch_size=8, micro_batch_size=1, train_iters=10, lr=1e-3, min_lr=1e-4)
    cfg.dataset.num_workers = 0
    return cfg
