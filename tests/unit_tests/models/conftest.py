"""Fixtures for model tests: megatron's parallel state on the world-size-1 gloo group (``gloo_world``).

Module tests run in-process on CPU without the CPU compatibility layer (it patches torch for the
whole process and cannot be undone); full-model tests that need it run in a child process.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

INTERPRETER_PROBE = Path(__file__).parent / "children" / "interpreter_probe.py"


def _interpreted_child_report(child: Path) -> dict:
    """Run a child program under Triton's CPU interpreter and return its ``REPORT {json}`` line.

    The interpreter switch must be set before Triton is imported, hence a child process.
    """
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(child)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


@functools.cache
def triton_interpreter_problem() -> str | None:
    """Why Triton's CPU interpreter cannot run this package's kernels here (``None``: it can).

    Asked of a minimal kernel (``children/interpreter_probe.py``), so a failure of our own kernels
    is never mistaken for the interpreter's: Triton 3.6's interpreter, for one, cannot use a scalar
    kernel argument as a loop bound under NumPy 2.5.
    """
    from megatron.bridge.models.torch_native.wgrad_accumulate import triton_available

    if not triton_available():
        return "Triton is not installed"
    probe = _interpreted_child_report(INTERPRETER_PROBE)
    if probe["ok"]:
        return None
    return (
        f"Triton {probe['triton']}'s CPU interpreter fails with NumPy {probe['numpy']} on a minimal kernel "
        f"({probe['error']}); on a GPU machine tests/gpu runs these kernels on CUDA instead"
    )


@pytest.fixture(scope="session")
def interpreter_problem() -> str | None:
    """:func:`triton_interpreter_problem`, for tests that run Triton's interpreter themselves."""
    return triton_interpreter_problem()


@pytest.fixture(scope="session")
def run_interpreted_child():
    """``run_interpreted_child(path) -> report``: a child program's report under Triton's interpreter;
    the calling test is skipped, with the reason, where the interpreter cannot run here."""

    def run(child: Path) -> dict:
        problem = triton_interpreter_problem()
        if problem:
            pytest.skip(problem)
        return _interpreted_child_report(child)

    return run


@pytest.fixture()
def model_parallel(gloo_world) -> Iterator[None]:
    """megatron-core parallel state for TP=PP=EP=1 on the gloo group; torn down after the test."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    torch.manual_seed(1234)
    # The inference tracker's forks are no-ops: megatron's CUDA RNG tracker cannot fork on CPU.
    tensor_parallel.model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True, force_reset_rng=True)
    try:
        yield
    finally:
        ps.destroy_model_parallel()


def _tiny_moe_config(**overrides):
    """A small fp32 Qwen3-MoE-like ``TransformerConfig`` for CPU module tests."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs = dict(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        ffn_hidden_size=64,
        moe_ffn_hidden_size=24,
        num_moe_experts=4,
        moe_router_topk=2,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


@pytest.fixture()
def tiny_moe_config():
    """Factory for a small fp32 MoE ``TransformerConfig`` (keyword overrides allowed)."""
    return _tiny_moe_config
