"""Rules bounding what the dataset build makes before the first step.

Every rank builds megatron-core's dataset indices for all the samples the run will read
(``train.train_iters x train.global_batch_size`` for training, plus the evaluation split: see
``facts/data_files.py``'s ``dataset_sample_counts``) before its first step, in memory: a document index
(one entry per document read, each epoch over again), a sample index and a shuffle index (one entry
per sample). A count no run means, such as ``--max_steps 99999999999999999999``, passes every range
and then keeps every rank in that build for as long as it takes to run out of memory, while the
harness can only say that the ranks are still starting. These rules refuse such sizes before launch,
with the count and why.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from megatron.core.datasets.gpt_dataset import MockGPTLowLevelDataset

from megatron.bridge.training.config_stages.facts.data_files import dataset_sample_counts
from megatron.bridge.training.config_stages.facts.memory_estimate import (
    gib,
    host_memory_bytes,
    limit_text,
    within_limit,
)
from megatron.bridge.training.config_stages.facts.parallel_layout import all_within
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

MAX_DATASET_TOKENS = 10**15
"""More tokens than any run reads: the largest published pretraining runs read about 4 x 10^13."""

SIZE_FIELDS: tuple[str, ...] = ("train.train_iters", "train.global_batch_size", "train.eval_iters", "model.seq_length")
"""What the dataset build's size follows from; each has a range rule (out of range: the range speaks)."""

INDEX_ENTRY_BYTES = 4
"""The smallest entry megatron-core's dataset indices use (int32 and uint32)."""


def _sizes_known(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return all_within(cfg, ctx, *SIZE_FIELDS)


def dataset_tokens(cfg: ConfigContainer) -> int:
    """Tokens of every sample the dataset build indexes (training and evaluation)."""
    return sum(dataset_sample_counts(cfg)) * cfg.model.seq_length


def _describe_tokens(cfg: ConfigContainer, ctx: RuleContext) -> str:
    train, evaluation = dataset_sample_counts(cfg)
    return (
        f"{dataset_tokens(cfg):.3g} ({train:.3g} training and {evaluation:.3g} evaluation samples of "
        f"{cfg.model.seq_length} tokens)"
    )


def index_bytes_per_rank(cfg: ConfigContainer) -> int:
    """A lower bound of the dataset indices one rank builds in memory: per split, its sample index
    (two entries per sample, one more row) and shuffle index (one entry per sample) and, for mock
    data, its document index (at least one entry per ``max_sequence_length`` tokens: no mock
    document is longer). Real data's document index depends on its documents and is left out."""
    total = 0
    longest = MockGPTLowLevelDataset.max_sequence_length
    for samples in dataset_sample_counts(cfg):
        entries = 2 * (samples + 1) + samples
        if cfg.dataset.is_mock:
            entries += math.ceil(samples * cfg.model.seq_length / longest)
        total += entries * INDEX_ENTRY_BYTES
    return total


def _ranks(ctx: RuleContext) -> int:
    return ctx.world_size if isinstance(ctx.world_size, int) and ctx.world_size > 0 else 1


def _index_applies(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return (
        cfg.dist.device == "cpu"
        and host_memory_bytes() is not None
        and _sizes_known(cfg, ctx)
        and dataset_tokens(cfg) <= MAX_DATASET_TOKENS
    )


def _describe_index(cfg: ConfigContainer, ctx: RuleContext) -> str:
    ranks = _ranks(ctx)
    return (
        f"at least {gib(index_bytes_per_rank(cfg) * ranks)} for the {ranks} rank(s) on this host "
        f"({gib(index_bytes_per_rank(cfg))} each)"
    )


_STEPS_FIX = (
    "give --max_steps (train.train_iters) the number of steps you mean to run, each reading "
    "train.global_batch_size samples of model.seq_length tokens; keep train.eval_iters to the batches "
    "an evaluation needs"
)

SIZE_RULES: tuple[Rule, ...] = (
    Rule(
        id="dataset-tokens-bounded",
        fields=SIZE_FIELDS,
        applies=_sizes_known,
        holds=lambda cfg, ctx: dataset_tokens(cfg) <= MAX_DATASET_TOKENS,
        message=f"the run would read more than {MAX_DATASET_TOKENS:.0e} tokens, more than any training run reads "
        "(the largest published ones read about 4e+13): every rank indexes all of those samples before its "
        "first step, so the ranks would stay in megatron-core's dataset build until they run out of memory",
        fix=_STEPS_FIX,
        derived_values=(("tokens", lambda cfg, ctx: _describe_tokens(cfg, ctx)),),
        group="sizes",
    ),
    Rule(
        id="dataset-index-fits-host-memory",
        fields=SIZE_FIELDS + ("dist.device",),
        applies=_index_applies,
        holds=lambda cfg, ctx: within_limit(index_bytes_per_rank(cfg) * _ranks(ctx), host_memory_bytes()),
        message="CPU smoke mode runs every rank on this host, and each builds the dataset's indices for every "
        "sample in memory before its first step (a lower bound: sample, shuffle and, for mock data, document "
        "index); together they need more memory than the host has",
        fix=_STEPS_FIX + " (CPU smoke mode checks that a configuration runs: a few steps are enough)",
        derived_values=(
            ("estimate", _describe_index),
            ("limit", lambda cfg, ctx: limit_text(host_memory_bytes(), "on this host")),
        ),
        group="sizes",
    ),
)
