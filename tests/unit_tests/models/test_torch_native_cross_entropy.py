"""The torch-native vocab-parallel cross-entropy against megatron-core's, on CPU.

In-process: the PyTorch backend against ``megatron.core.tensor_parallel.vocab_parallel_cross_entropy``
(loss and logits gradient). In child processes: the Triton kernels under Triton's CPU interpreter,
and tensor parallelism over two gloo ranks holding vocabulary shards.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native import cross_entropy as ce

# Vocabulary sizes: below one Triton block, several blocks, and not a multiple of the block.
VOCABS = (300, 9000)


def _case(vocab: int, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(6, 3, vocab, generator=g) * 4).to(dtype)
    target = torch.randint(0, vocab, (6, 3), generator=g)
    weight = torch.randn(6, 3, generator=g)
    return logits, target, weight


def _loss_and_grad(fn, logits, target, weight):
    x = logits.clone().requires_grad_()
    loss = fn(x, target)
    (loss * weight).sum().backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("vocab", VOCABS)
def test_torch_backend_matches_megatron(gloo_world, vocab):
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy as megatron_ce

    logits, target, weight = _case(vocab)
    # megatron-core's loss overwrites its input in place: hand it a non-leaf copy.
    ref_loss, ref_grad = _loss_and_grad(
        lambda x, t: megatron_ce(x * 1.0, t, tp_group=dist.group.WORLD), logits, target, weight
    )
    loss, grad = _loss_and_grad(
        lambda x, t: ce.vocab_parallel_cross_entropy(x, t, backend="torch"), logits, target, weight
    )
    assert loss.dtype == torch.float32 and loss.shape == target.shape
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_bf16_logits_give_fp32_loss_and_bf16_grad():
    logits, target, weight = _case(500, dtype=torch.bfloat16)
    loss, grad = _loss_and_grad(
        lambda x, t: ce.vocab_parallel_cross_entropy(x, t, backend="torch"), logits, target, weight
    )
    ref = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 500), target.reshape(-1), reduction="none")
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss.reshape(-1), ref, rtol=1e-5, atol=1e-5)


def test_chunked_torch_path_equals_one_chunk(monkeypatch):
    logits, target, weight = _case(700)
    whole = _loss_and_grad(lambda x, t: ce.vocab_parallel_cross_entropy(x, t, backend="torch"), logits, target, weight)
    monkeypatch.setattr(ce, "_TORCH_CHUNK_ELEMENTS", 700 * 4)  # four rows per chunk
    chunked = _loss_and_grad(
        lambda x, t: ce.vocab_parallel_cross_entropy(x, t, backend="torch"), logits, target, weight
    )
    torch.testing.assert_close(chunked[0], whole[0], rtol=0, atol=0)
    torch.testing.assert_close(chunked[1], whole[1], rtol=0, atol=0)


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="disagree"):
        ce.vocab_parallel_cross_entropy(torch.zeros(4, 2, 10), torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize(
    "requested, device, expected",
    [
        ("auto", "cpu", "torch"),
        ("auto", "cuda", "triton" if ce.triton is not None else "torch"),
        ("torch", "cuda", "torch"),
    ],
)
def test_backend_choice(monkeypatch, requested, device, expected):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert ce.select_backend(device, requested) == expected


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="not one of"):
        ce.select_backend("cpu", "cuda-graphs")


class _LossModelStandIn:
    """What ``compute_language_model_loss`` reads of the model: its config and TP group."""

    def __init__(self, backend):
        self.config, self.tp_group = SimpleNamespace(torch_native_cross_entropy_backend=backend), None


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_the_model_runs_the_configured_backend(monkeypatch, backend):
    from megatron.bridge.models.torch_native.gpt_model import TorchNativeLossGPTModel

    seen = []
    original = ce.select_backend
    monkeypatch.setattr(
        ce, "select_backend", lambda device, requested="auto": seen.append(requested) or original(device, requested)
    )
    logits, labels = torch.randn(4, 2, 10), torch.randint(0, 10, (2, 4))
    loss = TorchNativeLossGPTModel.compute_language_model_loss(_LossModelStandIn(backend), labels, logits)
    assert loss.shape == (2, 4) and seen == [backend]


# ---------------------------------------------------------------------------------------------
# Two child ranks (one start-up for all): Triton's interpreter must be on before triton is imported,
# and tensor parallelism needs two ranks. Each rank checks the interpreted Triton kernels against
# the PyTorch backend, then both backends with the vocabulary split over the two ranks.

CHILD = Path(__file__).parent / "children" / "cross_entropy_tp2.py"


@pytest.fixture(scope="module")
def child_reports(tmp_path_factory, run_child_script, interpreter_problem) -> list:
    env = {"CROSS_ENTROPY_CHILD_TRITON": "0" if interpreter_problem else "1"}
    return run_child_script(CHILD, tmp_path_factory.mktemp("cross_entropy"), world_size=2, timeout=600, env_extra=env)


@pytest.fixture
def triton_reports(child_reports, interpreter_problem) -> list:
    """The child reports, for tests of the interpreted Triton kernels (skipped where it cannot run)."""
    if interpreter_problem:
        pytest.skip(interpreter_problem)
    return child_reports


@pytest.mark.parametrize("vocab", ["300", "9000"])
def test_triton_kernels_match_torch_backend_in_interpreter(triton_reports, vocab):
    for report in triton_reports:
        r = report["interpreted"][vocab]
        assert r["picked"] == "triton"
        assert r["loss_diff"] <= 1e-5
        assert r["grad_diff"] <= 1e-6 * max(1.0, r["grad_scale"])


def test_triton_kernels_handle_rows_that_are_not_adjacent(triton_reports):
    for report in triton_reports:
        r = report["strided_rows"]
        assert r["loss_diff"] == 0.0 and r["grad_diff"] == 0.0 and r["grad_outside"] == 0.0


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_tensor_parallel_shards_match_full_vocabulary(request, child_reports, backend):
    if backend == "triton":
        child_reports = request.getfixturevalue("triton_reports")
    assert sum(r["targets_on_this_shard"] for r in child_reports) == 12
    for report in child_reports:
        assert 0 < report["targets_on_this_shard"] < 12  # both shards own some targets
        r = report["tensor_parallel"][backend]
        assert r["loss_diff"] <= 1e-5
        assert r["grad_diff"] <= 1e-6


# ---------------------------------------------------------------------------------------------
# Provider: which model class and which start-up line each setting gives.


@pytest.mark.parametrize(
    "fusion, impl, model_class, line",
    [
        (True, "torch_native", "TorchNativeLossGPTModel", "loss: torch_native fused cross-entropy (torch kernels)"),
        (True, "native", "GPTModel", "loss: megatron-core fused cross-entropy (native)"),
        (False, "torch_native", "GPTModel", "loss: megatron-core unfused vocab-parallel cross-entropy (fp32 logits)"),
    ],
)
def test_provider_loss_selection(monkeypatch, fusion, impl, model_class, line):
    from megatron.bridge.models.qwen import Qwen3MoEModelProvider

    provider = Qwen3MoEModelProvider(cross_entropy_loss_fusion=fusion, cross_entropy_fusion_impl=impl)
    assert provider.model_class().__name__ == model_class
    assert provider.describe_loss("cpu") == line


def test_start_up_line_names_the_configured_backend():
    from megatron.bridge.models.qwen import Qwen3MoEModelProvider

    provider = Qwen3MoEModelProvider(
        cross_entropy_loss_fusion=True,
        cross_entropy_fusion_impl="torch_native",
        torch_native_cross_entropy_backend="torch",
    )
    assert provider.describe_loss("cuda") == "loss: torch_native fused cross-entropy (torch kernels)"


def test_qwen3_recipes_default_to_the_torch_native_loss():
    from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config

    model = qwen3_30b_a3b_pretrain_config().model
    assert model.uses_torch_native_loss
