"""The platform of a run (GPUs or CPU smoke mode): chosen once from the config, and each of its
device-dependent steps."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from megatron.bridge.training import gpt_step
from megatron.bridge.training.devices.platform import CpuPlatform, CudaPlatform, select_platform


def _cfg(
    device: str,
    backend: str | None = None,
    distributed_optimizer: bool = True,
    te_rng_tracker: bool = False,
    cuda_graph_impl: str = "none",
) -> SimpleNamespace:
    effective = backend or ("gloo" if device == "cpu" else "nccl")
    return SimpleNamespace(
        dist=SimpleNamespace(device=device, effective_backend=effective),
        ddp=SimpleNamespace(use_distributed_optimizer=distributed_optimizer),
        rng=SimpleNamespace(te_rng_tracker=te_rng_tracker),
        model=SimpleNamespace(cuda_graph_impl=cuda_graph_impl),
    )


@pytest.mark.parametrize(
    "te_rng_tracker,cuda_graph_impl,graph_safe",
    [(False, "none", False), (True, "none", False), (False, "full_iteration", True)],
)
def test_gpu_seeding_hands_megatron_the_rng_tracker_settings(
    monkeypatch, te_rng_tracker, cuda_graph_impl, graph_safe
) -> None:
    """The GPU path's seeding runs here against a stand-in for megatron's CUDA seeding; a captured
    graph needs megatron's graph-safe RNG tracker (a plain one fails the capture)."""
    from megatron.core import tensor_parallel

    calls = []
    monkeypatch.setattr(
        tensor_parallel, "model_parallel_cuda_manual_seed", lambda seed, **kwargs: calls.append((seed, kwargs))
    )
    cfg = _cfg("cuda", te_rng_tracker=te_rng_tracker, cuda_graph_impl=cuda_graph_impl)
    CudaPlatform(cfg).seed_model_parallel(1234)
    assert calls == [
        (1234, {"te_rng_tracker": te_rng_tracker, "use_cudagraphable_rng": graph_safe, "force_reset_rng": True})
    ]


@pytest.mark.parametrize("first_impl,second_impl", [("none", "full_iteration"), ("full_iteration", "none")])
def test_each_run_gets_the_rng_tracker_its_graph_setting_needs(monkeypatch, first_impl, second_impl) -> None:
    """Two runs in one process (benchmarks, A/B sweeps): megatron-core keeps its first RNG tracker
    unless the seeding resets it, so an eager run followed by a graph run failed the capture. The
    CUDA seeding runs with megatron's real tracker set-up; only the per-device CUDA state is left out."""
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as megatron_random

    def seed_tracker_only(seed, te_rng_tracker=False, use_cudagraphable_rng=False, force_reset_rng=False, **_):
        megatron_random.initialize_rng_tracker(
            te_rng_tracker, False, use_cudagraphable_rng, force_reset=force_reset_rng
        )

    monkeypatch.setattr(tensor_parallel, "model_parallel_cuda_manual_seed", seed_tracker_only)
    for impl in (first_impl, second_impl):
        CudaPlatform(_cfg("cuda", cuda_graph_impl=impl)).seed_model_parallel(1234)
        assert megatron_random.get_cuda_rng_tracker().use_cudagraphable_rng is (impl == "full_iteration")


@pytest.mark.parametrize(
    "device,backend,distributed_optimizer,kind,resync",
    [
        ("cpu", None, True, CpuPlatform, True),  # gloo: the optimizer's param gather needs a re-sync
        ("cpu", None, False, CpuPlatform, False),
        ("cuda", None, True, CudaPlatform, False),  # NCCL
        ("cuda", "gloo", True, CudaPlatform, True),  # several ranks on one GPU
        ("cuda", "gloo", False, CudaPlatform, False),
    ],
)
def test_platform_is_chosen_from_device_and_backend(device, backend, distributed_optimizer, kind, resync) -> None:
    chosen = select_platform(_cfg(device, backend, distributed_optimizer))
    assert type(chosen) is kind
    assert chosen.resync_params is resync
    assert chosen.device_type == device


@pytest.mark.parametrize(
    "kind,uses_cuda,explicit_causal_mask",
    [(CpuPlatform, False, True), (CudaPlatform, True, False)],
)
def test_what_the_loop_and_data_ask_of_each_platform(kind, uses_cuda, explicit_causal_mask) -> None:
    chosen = kind(_cfg(kind.device_type))
    assert chosen.uses_cuda is uses_cuda  # CUDA timing events, profiler activity, pinned memory
    assert chosen.explicit_causal_mask is explicit_causal_mask


class _Chunk:
    def __init__(self) -> None:
        self.synced: list[bool] = []

    def start_param_sync(self, force_sync: bool = False) -> None:
        self.synced.append(force_sync)


@pytest.mark.parametrize("backend,expected", [("gloo", [True]), ("nccl", [])])
def test_parameters_are_regathered_after_the_optimizer_step_only_over_gloo(backend, expected) -> None:
    chunks = [_Chunk(), _Chunk()]
    CudaPlatform(_cfg("cuda", backend)).after_optimizer_step(chunks)
    assert [c.synced for c in chunks] == [expected, expected]


@pytest.mark.parametrize("backend,compat_enabled", [("gloo", True), ("nccl", False)])
def test_gpu_process_preparation(monkeypatch, backend, compat_enabled) -> None:
    from megatron.bridge.training.devices import gloo_cuda_compat

    calls = []
    monkeypatch.setattr(gloo_cuda_compat, "enable_gloo_cuda_compat", lambda: calls.append("gloo"))
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    CudaPlatform(_cfg("cuda", backend)).prepare_process(SimpleNamespace(cuda_device_max_connections=32))
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert calls == (["gloo"] if compat_enabled else [])


def test_cpu_platform_keeps_megatrons_optimizer_and_the_cpu_device() -> None:
    chosen = CpuPlatform(_cfg("cpu"))
    assert chosen.device == torch.device("cpu")
    assert chosen.fast_optimizer_kernels(object()) == "optimizer kernels: megatron-core's (CPU)"
    module = torch.nn.Linear(2, 2)
    assert chosen.place(module) is module


def test_the_batch_goes_to_the_device_of_the_model() -> None:
    batch = {"tokens": torch.ones(1, 4, dtype=torch.long), "labels": torch.ones(1, 4, dtype=torch.long)}
    model = torch.nn.Linear(2, 2).to(torch.float64)
    moved = gpt_step.get_batch(iter([batch]), gpt_step.model_device(model))
    assert moved["tokens"].device == next(model.parameters()).device
    assert moved["position_ids"] is None  # keys the data does not carry stay empty
    assert gpt_step.get_batch(None, torch.device("cpu"))["tokens"] is None  # a stage without data


@pytest.mark.parametrize(
    "offloading, counted, expected",
    [
        (False, {"attn_norm": 3}, None),
        (True, None, dict(bytes_per_step=0, by_module={})),  # before the manager's warm-up step
        (
            True,
            {"attn_norm": 3 * 2**20, "mlp_norm": 2**20},
            dict(bytes_per_step=4 * 2**20, by_module={"attn_norm": 3 * 2**20, "mlp_norm": 2**20}),
        ),
    ],
)
def test_the_summary_keeps_what_megatrons_offload_manager_counted(monkeypatch, offloading, counted, expected):
    """The bytes come from megatron-core's offload manager itself (what it counted after warm-up), not
    from the table it prints."""
    from megatron.core.pipeline_parallel import fine_grained_activation_offload as offload

    manager = SimpleNamespace() if counted is None else SimpleNamespace(offload_summary_bytes=counted)
    monkeypatch.setattr(offload.PipelineOffloadManager, "OFFLOAD_MGR", manager)
    cfg = _cfg("cuda")
    cfg.model.fine_grained_activation_offloading = offloading
    assert CudaPlatform(cfg).activation_offload_record() == expected
