"""Training data through megatron-core's dataset stack: mock GPT data or indexed ``.bin/.idx`` data.

* Mock data (``cfg.dataset.data_paths is None``): ``GPTDatasetConfig`` with no blend, built by
  ``BlendedMegatronDatasetBuilder`` into ``MockGPTDataset``.
* Indexed data: ``data_paths`` as megatron's blend list (``["0.3", "/a", "0.7", "/b"]`` or plain
  prefixes).

The tokenizer is megatron-core's ``NullTokenizer`` (no files, no downloads) unless a Hugging Face
tokenizer is configured. The sequence length comes from ``cfg.model.seq_length`` and the shuffle
seed from ``cfg.dataset.random_seed``, else ``cfg.rng.seed``. The compiled dataset helper ships with the wheel, so
``compile_helpers()`` is never called.

Batches are drawn like megatron's pretraining sampler: consecutive slices of
``micro_batch_size * data_parallel_size`` samples, each data-parallel rank taking its part. The
sampler starts at ``consumed_samples``, which is what makes a resumed run see the same data.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from megatron.core import parallel_state
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.tokenizers import MegatronTokenizer

from megatron.bridge.training.config_stages.facts.data_files import blend, dataset_sample_counts
from megatron.bridge.training.devices.platform import Platform, select_platform
from megatron.bridge.training.loop.stop_request import STOP_SIGNALS

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

logger = logging.getLogger(__name__)


def build_tokenizer(cfg: ConfigContainer) -> Any:
    """megatron-core tokenizer for the dataset (``NullTokenizer``: vocab from ``cfg.model``)."""
    tok = cfg.tokenizer
    if tok.tokenizer_type == "NullTokenizer":
        vocab = tok.vocab_size or cfg.model.vocab_size
        return MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=int(vocab))
    if tok.tokenizer_type == "HuggingFaceTokenizer":
        return MegatronTokenizer.from_pretrained(
            tokenizer_path=tok.tokenizer_model,
            metadata_path={"library": "huggingface"},
            **(tok.hf_tokenizer_kwargs or {}),
        )
    raise ValueError(f"tokenizer.tokenizer_type={tok.tokenizer_type!r} is not supported")


def dataset_seed(cfg: ConfigContainer) -> int:
    """``dataset.random_seed`` when set, else ``rng.seed``."""
    return cfg.dataset.random_seed if cfg.dataset.random_seed is not None else cfg.rng.seed


def gpt_dataset_config(cfg: ConfigContainer, tokenizer: Any, platform: Platform | None = None) -> Any:
    """The ``GPTDatasetConfig`` for this run (mock when no data paths are given)."""
    ds = cfg.dataset
    return GPTDatasetConfig(
        random_seed=dataset_seed(cfg),
        sequence_length=cfg.model.seq_length,
        blend=blend(ds.data_paths),
        split=ds.split,
        path_to_cache=ds.path_to_cache,
        mmap_bin_files=ds.mmap_bin_files,
        tokenizer=tokenizer,
        reset_position_ids=ds.reset_position_ids,
        reset_attention_mask=ds.reset_attention_mask,
        eod_mask_loss=ds.eod_mask_loss,
        create_attention_mask=(platform or select_platform(cfg)).explicit_causal_mask or ds.reset_attention_mask,
    )


def build_train_dataset(cfg: ConfigContainer, platform: Platform | None = None) -> Any:
    """The training split, sized for ``train_iters * global_batch_size`` samples."""
    tokenizer = build_tokenizer(cfg)
    ds_cfg = gpt_dataset_config(cfg, tokenizer, platform)
    cls = MockGPTDataset if cfg.dataset.is_mock else GPTDataset
    train_samples, eval_samples = dataset_sample_counts(cfg)
    train, _valid, _test = BlendedMegatronDatasetBuilder(
        cls, [train_samples, eval_samples, 0], lambda: True, ds_cfg
    ).build()
    return train


class PretrainingSampler:
    """Indices of this data-parallel rank's micro-batches, starting after ``consumed_samples``."""

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
    ) -> None:
        if total_samples <= 0 or micro_batch_size <= 0:
            raise ValueError("total_samples and micro_batch_size must be positive")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank {data_parallel_rank} out of range")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.dp_rank = data_parallel_rank
        self.dp_size = data_parallel_size

    def __iter__(self) -> Iterator[list[int]]:
        step = self.micro_batch_size * self.dp_size
        start = self.consumed_samples
        while start + step <= self.total_samples:
            first = start + self.dp_rank * self.micro_batch_size
            yield list(range(first, first + self.micro_batch_size))
            start += step


def _ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers leave SIGTERM/SIGINT to their rank.

    SLURM and torchrun signal a rank's whole process group; a loader worker killed by that signal
    would make the rank's next batch fail instead of letting it finish the step and save.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def build_train_iterator(
    cfg: ConfigContainer, consumed_samples: int = 0, platform: Platform | None = None
) -> Iterator[dict]:
    """An endless-enough iterator of this rank's micro-batches (dicts of CPU tensors)."""
    platform = platform or select_platform(cfg)
    dataset = build_train_dataset(cfg, platform)
    sampler = PretrainingSampler(
        total_samples=len(dataset),
        consumed_samples=consumed_samples,
        micro_batch_size=cfg.train.micro_batch_size,
        data_parallel_rank=parallel_state.get_data_parallel_rank(),
        data_parallel_size=parallel_state.get_data_parallel_world_size(),
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=cfg.dataset.num_workers,
        pin_memory=platform.uses_cuda,
        persistent_workers=cfg.dataset.num_workers > 0,
        worker_init_fn=_ignore_stop_signals if cfg.dataset.num_workers > 0 else None,
    )
    return iter(loader)
