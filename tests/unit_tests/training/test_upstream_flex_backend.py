"""``apply_flex_dispatcher_backend`` as Megatron-Bridge scripts call it: no target GPU given, so the
GPU this process runs on decides. A dense model is left alone with a warning, a GPU that cannot be
read is an error (never "unknown, applied anyway"), and an unsupported GPU is refused in
Megatron-Bridge's words plus the field, the value and the fix."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from megatron.bridge.models.qwen import Qwen3MoEModelProvider
from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.errors import CommOverlapConfigError
from megatron.bridge.training.flex_dispatcher_backend import (
    FlexDispatcherBackendError,
    FlexGpuProbeError,
    apply_flex_dispatcher_backend,
    validate_flex_dispatcher_backend,
)

DISPATCHER_FIELDS = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_shared_expert_overlap")

DEEPEP_WORDS = "DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs"
HYBRIDEP_WORDS = "HybridEP is only applicable for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and B300 GPUs"
NCCLEP_WORDS = "NCCL EP is only applicable to Hopper and Blackwell GPUs"
WORDS = {"deepep": DEEPEP_WORDS, "hybridep": HYBRIDEP_WORDS, "ncclep": NCCLEP_WORDS}
VALIDATE_WORDS = {  # upstream's validate_flex_dispatcher_backend error sentences
    "deepep": "DeepEP is supported for Ampere, Hopper, and Blackwell (B200/B300) GPUs",
    "hybridep": "HybridEP is supported for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and B300 GPUs",
    "ncclep": "NCCL EP is supported for Hopper and Blackwell GPUs",
}

VOLTA = ((7, 0), "Tesla V100-SXM2-32GB")
FUTURE_11 = ((11, 0), "NVIDIA Next")
FUTURE_12 = ((12, 0), "NVIDIA RTX PRO 6000 Blackwell Server Edition")
H100 = ((9, 0), "NVIDIA H100 80GB HBM3")
B200 = ((10, 0), "NVIDIA B200")
GB200 = ((10, 0), "NVIDIA GB200")
A100 = ((8, 0), "NVIDIA A100-SXM4-80GB")


@pytest.fixture
def model() -> Qwen3MoEModelProvider:
    m = qwen3_moe_tiny_pretrain_config().model
    m.moe_shared_expert_overlap = True
    return m


def dispatcher_state(model) -> tuple:
    return tuple(getattr(model, name) for name in DISPATCHER_FIELDS)


@pytest.fixture
def gpu(monkeypatch, simulate_host):
    """The described host counts one GPU that only torch can tell (its own probe cannot).

    Call it with ``((major, minor), name)``, or with an exception that the CUDA probe raises.
    """

    def install(device: tuple[tuple[int, int], str] | BaseException) -> None:
        def properties(index: int = 0):
            if isinstance(device, BaseException):
                raise device
            (major, minor), name = device
            return SimpleNamespace(major=major, minor=minor, name=name)

        simulate_host(gpu_capability=None, gpu_name=None, gpus=1)
        monkeypatch.setattr(torch.cuda, "get_device_properties", properties)

    return install


@pytest.mark.parametrize("experts", [None, 0])
@pytest.mark.parametrize("backend", ["deepep", "hybridep", None])
def test_dense_model_is_left_alone_with_a_warning(experts, backend: str | None, model, gpu, caplog) -> None:
    gpu(RuntimeError("a dense model needs no GPU probe"))
    model.num_moe_experts = experts
    before = dispatcher_state(model)
    with caplog.at_level(logging.WARNING):
        assert apply_flex_dispatcher_backend(model, backend) is None
    assert dispatcher_state(model) == before
    assert "only applicable to MoE models" in caplog.text and f"num_moe_experts={experts!r}" in caplog.text


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
@pytest.mark.parametrize(
    "failure",
    [RuntimeError("CUDA error: no CUDA-capable device is detected"), AssertionError("Invalid device id")],
    ids=["cuda-error", "bad-device"],
)
def test_failing_gpu_probe_raises_instead_of_applying_unchecked(backend: str, failure, model, gpu) -> None:
    gpu(failure)
    before = dispatcher_state(model)
    with pytest.raises(FlexDispatcherBackendError) as info:
        apply_flex_dispatcher_backend(model, backend)
    assert info.value.__cause__ is failure
    (violation,) = info.value.violations
    assert violation.rule == "flex-backend-gpu-probe-failed"
    assert violation.fields[0] == "model.moe_flex_dispatcher_backend" and violation.values[0] == backend
    assert str(failure) in str(info.value) and "device_name=" in violation.fix
    assert dispatcher_state(model) == before


UNSUPPORTED = [
    ("deepep", VOLTA),
    ("hybridep", VOLTA),
    ("deepep", FUTURE_11),
    ("hybridep", FUTURE_11),
    ("deepep", FUTURE_12),
    ("hybridep", FUTURE_12),
    ("deepep", GB200),
    ("ncclep", VOLTA),
    ("ncclep", A100),
    ("ncclep", FUTURE_12),
]


@pytest.mark.parametrize("backend, device", UNSUPPORTED, ids=lambda x: x if isinstance(x, str) else x[1])
def test_unsupported_gpu_is_refused_in_upstream_words_with_field_value_and_fix(backend, device, model, gpu) -> None:
    gpu(device)
    before = dispatcher_state(model)
    with pytest.raises(FlexDispatcherBackendError) as info:
        apply_flex_dispatcher_backend(model, backend)
    text = str(info.value)
    assert isinstance(info.value, CommOverlapConfigError)
    assert WORDS[backend] in text and "Current GPU" in text
    assert f"model.moe_flex_dispatcher_backend={backend!r}" in text
    assert "fix:" in text and "moe_flex_dispatcher_backend=null" in text
    assert dispatcher_state(model) == before


SUPPORTED = [
    ("deepep", H100),
    ("hybridep", H100),
    ("deepep", B200),
    ("hybridep", B200),
    ("hybridep", GB200),
    ("ncclep", H100),
    ("ncclep", B200),
    ("ncclep", GB200),
]


@pytest.mark.parametrize("backend, device", SUPPORTED, ids=lambda x: x if isinstance(x, str) else x[1])
def test_supported_gpu_seen_by_the_probe_gets_the_backend(backend, device, model, gpu, caplog) -> None:
    gpu(device)
    with caplog.at_level(logging.WARNING):
        assert apply_flex_dispatcher_backend(model, backend) == backend
    assert dispatcher_state(model) == ("flex", backend, False)
    assert "flex-backend-gpu-not-checked" not in caplog.text  # checked against the GPU torch reported


@pytest.mark.host("cpu")
def test_validate_speaks_the_same_words_for_the_target_gpu() -> None:
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.target_gpu = "gb200"
    cfg.model.moe_token_dispatcher_type, cfg.model.moe_flex_dispatcher_backend = "flex", "deepep"
    with pytest.raises(CommOverlapConfigError) as info:
        cfg.validate(world_size=1)
    assert DEEPEP_WORDS in str(info.value) and "model.moe_flex_dispatcher_backend='deepep'" in str(info.value)


@pytest.mark.parametrize("backend", ["deepep", "ncclep"])
def test_a_failing_gpu_probe_is_also_a_runtime_error(backend, model, gpu) -> None:
    """Upstream's helper lets torch's CUDA error through; scripts that catch it as a RuntimeError
    still do, and it is the listed problem with its fix as well."""
    failure = RuntimeError("CUDA initialization failed")
    gpu(failure)
    with pytest.raises(RuntimeError, match="CUDA initialization failed") as info:
        apply_flex_dispatcher_backend(model, backend)
    assert isinstance(info.value, FlexGpuProbeError) and isinstance(info.value, FlexDispatcherBackendError)
    assert info.value.__cause__ is failure


@pytest.mark.parametrize("major, backend, applied", [(9, "deepep", True), (8, "ncclep", False), (7, "hybridep", False)])
def test_properties_without_a_name_are_checked_by_architecture(
    major, backend, applied, model, monkeypatch, gpu
) -> None:
    """A device whose properties give only the capability major (a driver or a stand-in that leaves the
    minor and the name out) is checked against its architecture, not refused as unreadable."""
    gpu(H100)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: SimpleNamespace(major=major))
    if applied:
        assert apply_flex_dispatcher_backend(model, backend) == backend
    else:
        with pytest.raises(FlexDispatcherBackendError) as info:
            apply_flex_dispatcher_backend(model, backend)
        assert [v.rule for v in info.value.violations] == ["flex-backend-supported-on-gpu"]


@pytest.mark.parametrize("backend, device", UNSUPPORTED, ids=lambda x: x if isinstance(x, str) else x[1])
def test_validate_checks_the_gpu_this_process_runs_on_in_upstream_words(backend, device, model, gpu) -> None:
    """``validate_flex_dispatcher_backend(model_config)`` as upstream calls it (no target GPU): a flex
    backend is checked against the GPU torch reports, with upstream's validation sentence in the error."""
    gpu(device)
    model.moe_token_dispatcher_type, model.moe_flex_dispatcher_backend = "flex", backend
    with pytest.raises(FlexDispatcherBackendError) as info:
        validate_flex_dispatcher_backend(model)
    assert isinstance(info.value, ValueError) and VALIDATE_WORDS[backend] in str(info.value)
    assert "flex-backend-supported-on-gpu" in {v.rule for v in info.value.violations}
