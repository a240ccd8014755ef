"""The CPU compatibility layer: each mapped CUDA call, and a tiny megatron GPTModel forward/backward.

Everything runs in a child process: ``enable_cpu_compat`` patches torch process-wide and must not
leak into the rest of the test session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHILD = Path(__file__).parent / "children" / "cpu_compat_model.py"


@pytest.fixture(scope="module")
def child_report(tmp_path_factory, run_child_script) -> dict:
    (report,) = run_child_script(CHILD, tmp_path_factory.mktemp("cpu_compat"))
    return report


def test_not_enabled_until_asked(child_report: dict) -> None:
    assert child_report["enabled_before"] is False
    assert child_report["enabled_after"] is True


def test_te_kernels_megatron_picked_at_import_are_replaced(child_report: dict) -> None:
    """With TE importable, megatron-core uses TE's CUDA-only router GEMM, fused Adam and gradient-norm
    kernels; in CPU smoke mode they give way to torch's (the tiny model's forward below routes tokens)."""
    assert child_report["te_kernels_replaced"] is True


def test_activation_is_logged(child_report: dict) -> None:
    assert "CPU smoke mode: megatron-core CUDA calls mapped to CPU" in child_report["stdout"]


def test_streams_behave(child_report: dict) -> None:
    assert child_report["stream_is_current"] is True


def test_cuda_device_requests_land_on_cpu(child_report: dict) -> None:
    assert child_report["factory_device"] == ["cpu"] * 4


@pytest.mark.parametrize("index,expected", [(0, "torch.cuda.FloatTensor"), (1, "torch.cuda.BFloat16Tensor")])
def test_tensor_type_reports_cuda(child_report: dict, index: int, expected: str) -> None:
    assert child_report["type"][index] == expected
    assert child_report["type_convert"] is True


def test_tiny_gpt_forward_backward(child_report: dict) -> None:
    assert child_report["loss"] == pytest.approx(child_report["loss"])  # finite float
    assert 0.0 < child_report["loss"] < 100.0
    assert child_report["grads_finite"] is True
    assert child_report["n_grads"] == child_report["n_params"]


def test_not_imported_by_the_package(child_report: dict) -> None:
    assert child_report["imported_implicitly"] is False
