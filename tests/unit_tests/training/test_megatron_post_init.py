"""megatron-core's ``TransformerConfig.__post_init__`` derives fields and re-checks its rules; it runs
once per process: once in the harness (the job's one resolution) and once on a rank (``pretrain``'s
resolution of the loaded config), never again on the way to the model (docs/architecture.md)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.bridge.perf.harness.run import main as harness_main
from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.loop import initialize
from megatron.bridge.training.pretrain import pretrain


class _StopAtProcessGroup(Exception):
    pass


@pytest.fixture
def post_init_calls(monkeypatch) -> list[object]:
    """Every run of megatron-core's ``TransformerConfig.__post_init__``, on any subclass."""
    original, calls = TransformerConfig.__post_init__, []

    def counted(self) -> None:
        calls.append(self)
        original(self)

    monkeypatch.setattr(TransformerConfig, "__post_init__", counted)
    return calls


def test_the_harness_runs_it_once_for_a_job(post_init_calls: list, tmp_path: Path) -> None:
    argv = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--max_steps", "4"]
    argv += ["--moe_a2a_overlap", "true", "--dryrun", "-l", str(tmp_path / "logs")]
    assert harness_main(argv, out=io.StringIO()) == 0
    assert len(post_init_calls) == 1


@pytest.mark.host("h100")  # a GPU rank: the CPU compatibility layer, process-wide, is not switched on
def test_a_rank_runs_it_once_before_the_process_group(post_init_calls: list, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)  # the resolution sets what the run needs
    cfg = qwen3_moe_tiny_pretrain_config()
    saved = tmp_path / "resolved.yaml"
    cfg.to_yaml(str(saved))
    assert post_init_calls == []  # building and saving a recipe defers it

    def stop(*args, **kwargs):
        raise _StopAtProcessGroup

    monkeypatch.setattr(initialize, "initialize_distributed", stop)
    with pytest.raises(_StopAtProcessGroup):
        pretrain(ConfigContainer.from_yaml(str(saved)))
    assert len(post_init_calls) == 1
