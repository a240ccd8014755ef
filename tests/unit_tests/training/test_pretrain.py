"""Pieces of ``pretrain`` that need no process group: launcher env, fail-fast validation, the
entry point's exit code, the data sampler, and the CUDA_DEVICE_MAX_CONNECTIONS hand-off."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training import entry
from megatron.bridge.training.config_stages.facts.data_files import blend
from megatron.bridge.training.devices.platform import set_cuda_device_max_connections
from megatron.bridge.training.errors import ConfigError
from megatron.bridge.training.loop.data import PretrainingSampler
from megatron.bridge.training.loop.initialize import launch_env
from megatron.bridge.training.pretrain import pretrain


@pytest.mark.parametrize(
    "environ,expected",
    [
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8, 1, "torchrun")),
        ({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1"}, (9, 16, 1, "slurm")),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "5", "SLURM_NTASKS": "16"},
            (0, 2, 0, "torchrun"),  # torchrun inside an allocation wins
        ),
        ({}, (0, 1, 0, "single")),
    ],
)
def test_launch_env(environ: dict, expected: tuple) -> None:
    env = launch_env(environ)
    assert (env.rank, env.world_size, env.local_rank, env.launcher) == expected


def _bad_cfg():
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True  # EP=1: a broken prerequisite
    return cfg


def test_bad_config_fails_before_any_process_group(monkeypatch) -> None:
    def no_process_group(*args, **kwargs):
        raise AssertionError("a process group was created before validation failed")

    monkeypatch.setattr(torch.distributed, "init_process_group", no_process_group)
    with pytest.raises(ConfigError):
        pretrain(_bad_cfg())
    compat = sys.modules.get("megatron.bridge.training.devices.cpu_compat")
    assert compat is None or not compat.cpu_compat_enabled()  # nothing was patched either


class _StopBeforeProcessGroup(Exception):
    pass


@pytest.mark.host("h100")
def test_pretrain_resolves_once_and_starts_from_that_resolution(monkeypatch, resolution_counter) -> None:
    """The finalized config and the start-up report pretrain uses come from one resolution."""
    from megatron.bridge.training.loop import initialize

    seen = {}

    def stop(resolved, *launch):
        seen["resolved"] = resolved
        raise _StopBeforeProcessGroup

    monkeypatch.setattr(initialize, "initialize_distributed", stop)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    cfg = qwen3_moe_tiny_pretrain_config()
    with pytest.raises(_StopBeforeProcessGroup):
        pretrain(cfg)
    assert len(resolution_counter) == 1
    assert seen["resolved"].model.overlap_moe_expert_parallel_comm is cfg.model.overlap_moe_expert_parallel_comm


def test_entry_exits_nonzero_with_the_error(tmp_path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    _bad_cfg().to_yaml(path)
    assert entry.main(["--config-file", str(path)]) == 1
    err = capsys.readouterr().err
    assert "training failed" in err and "expert_model_parallel_size" in err


def test_entry_requires_a_config_file() -> None:
    with pytest.raises(SystemExit):
        entry.parse_args([])


@pytest.mark.parametrize(
    "consumed,rank,expected_first",
    [(0, 0, [[0], [2], [4]]), (0, 1, [[1], [3], [5]]), (4, 0, [[4], [6]]), (4, 1, [[5], [7]])],
)
def test_sampler_slices_and_resumes(consumed: int, rank: int, expected_first: list) -> None:
    sampler = PretrainingSampler(8, consumed, micro_batch_size=1, data_parallel_rank=rank, data_parallel_size=2)
    assert list(sampler)[: len(expected_first)] == expected_first


def test_sampler_micro_batches() -> None:
    sampler = PretrainingSampler(12, 0, micro_batch_size=2, data_parallel_rank=1, data_parallel_size=3)
    assert list(sampler) == [[2, 3], [8, 9]]


@pytest.mark.parametrize("bad", [dict(total_samples=0), dict(data_parallel_rank=2)])
def test_sampler_rejects_bad_arguments(bad: dict) -> None:
    args = dict(total_samples=8, consumed_samples=0, micro_batch_size=1, data_parallel_rank=0, data_parallel_size=2)
    args.update(bad)
    with pytest.raises(ValueError):
        PretrainingSampler(**args)


@pytest.mark.parametrize(
    "paths,expected",
    [
        (None, None),
        (["/a", "/b"], (["/a", "/b"], None)),
        (["0.3", "/a", "0.7", "/b"], (["/a", "/b"], [0.3, 0.7])),
    ],
)
def test_blend(paths, expected) -> None:
    assert blend(paths) == expected


@pytest.mark.parametrize("need,env_before,env_after", [(32, None, "32"), (None, None, None), (None, "1", "1")])
def test_cuda_device_max_connections(monkeypatch, need, env_before, env_after) -> None:
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    if env_before is not None:
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", env_before)
    set_cuda_device_max_connections(SimpleNamespace(cuda_device_max_connections=need))
    assert os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == env_after
