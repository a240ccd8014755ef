"""Training data through megatron-core's builders: mock data and indexed .bin/.idx data."""

from __future__ import annotations

import torch

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.loop.data import build_tokenizer, build_train_dataset


def _cfg(tmp_path, **dataset):
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.train.train_iters = 2
    cfg.dataset.path_to_cache = str(tmp_path / "cache")
    for key, value in dataset.items():
        setattr(cfg.dataset, key, value)
    return cfg


def test_null_tokenizer_takes_the_model_vocab(tmp_path) -> None:
    tok = build_tokenizer(_cfg(tmp_path))
    assert tok.vocab_size == 1024


def test_mock_data_shape_seed_and_cpu_mask(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    ds = build_train_dataset(cfg)
    assert len(ds) >= cfg.train.train_iters * cfg.train.global_batch_size
    sample = ds[0]
    assert sample["tokens"].shape == (cfg.model.seq_length,)
    assert torch.equal(sample["labels"][:-1], sample["tokens"][1:])
    assert sample["attention_mask"].shape == (1, cfg.model.seq_length, cfg.model.seq_length)  # CPU: explicit
    again = build_train_dataset(_cfg(tmp_path / "b"))
    assert torch.equal(again[3]["tokens"], ds[3]["tokens"])  # deterministic with rng.seed
    other = _cfg(tmp_path / "c")
    other.rng.seed = 7
    assert not torch.equal(build_train_dataset(other)[3]["tokens"], ds[3]["tokens"])


def test_indexed_dataset(tmp_path, indexed_corpus) -> None:
    cfg = _cfg(tmp_path, data_paths=[indexed_corpus], split="100,0,0")
    ds = build_train_dataset(cfg)
    sample = ds[0]
    assert sample["tokens"].shape == (cfg.model.seq_length,)
    assert int(sample["tokens"].max()) < 1000
