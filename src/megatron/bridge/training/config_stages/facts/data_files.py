"""What the dataset settings name on disk and how many samples the dataset build indexes.

Read by the rules before launch (``validation.py``: data files that do not exist; ``size_rules.py``:
what the index build holds in memory) and by the loop's data pipeline (``training/loop/data.py``),
so both count the same files and samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def blend(data_paths: list[str] | None) -> tuple[list[str], list[float] | None] | None:
    """megatron's blend tuple from ``["w1", "p1", "w2", "p2"]`` or ``["p1", "p2"]``."""
    if not data_paths:
        return None
    try:
        weights = [float(x) for x in data_paths[0::2]]
        return (list(data_paths[1::2]), weights)
    except ValueError:
        return (list(data_paths), None)


def data_prefixes(data_paths: list[str] | None) -> list[str]:
    """The dataset prefixes of ``data_paths`` (a blend list's weights left out)."""
    found = blend(data_paths)
    return list(found[0]) if found else []


def missing_data_files(data_paths: list[str] | None) -> list[str]:
    """The ``.bin``/``.idx`` files of ``data_paths`` that do not exist."""
    return [
        f"{p}{suffix}"
        for p in data_prefixes(data_paths)
        for suffix in (".bin", ".idx")
        if not Path(f"{p}{suffix}").is_file()
    ]


def dataset_sample_counts(cfg: ConfigContainer) -> tuple[int, int]:
    """Samples the dataset build indexes (training, evaluation) before the first step; the size rules
    (``training/config_stages/rules/size_rules.py``) bound them."""
    train_samples = cfg.train.train_iters * cfg.train.global_batch_size
    eval_samples = max(cfg.train.eval_iters, 1) * cfg.train.global_batch_size
    return train_samples, eval_samples
