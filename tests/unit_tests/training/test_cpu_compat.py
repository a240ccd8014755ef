"""The CPU compatibility layer: each mapped CUDA call, and a tiny megatron GPTModel forward/backward.

Everything runs in a child process: ``enable_cpu_compat`` patches torch process-wide and must not
leak into the rest of the test session.
"""

from __future__ import annotations

import textwrap

import pytest


CHILD = textwrap.dedent(
    r"""
    import json, os, sys
    import torch
    import torch.distributed as dist
    import megatron.bridge.training.config, megatron.bridge.recipes.qwen

    # Importing training code must not import (let alone activate) the compat layer.
    report = {"imported_implicitly": "megatron.bridge.training.cpu_compat" in sys.modules}
    from megatron.bridge.training import cpu_compat

    report["enabled_before"] = cpu_compat.cpu_compat_enabled()
    cpu_compat.enable_cpu_compat()
    cpu_compat.enable_cpu_compat()  # idempotent
    report["enabled_after"] = cpu_compat.cpu_compat_enabled()

    # Streams and events.
    s = torch.cuda.Stream(device="cuda", priority=-1)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        report["stream_is_current"] = torch.cuda.current_stream() is s
    ev = s.record_event()
    ev.synchronize()
    torch.cuda.default_stream().wait_event(torch.cuda.Event())
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("x"); torch.cuda.nvtx.range_pop()
    # Devices and factories.
    t = torch.zeros(3, device="cuda")
    u = torch.empty(2, device=torch.cuda.current_device())
    report["factory_device"] = [str(t.device), str(u.device), str(t.to("cuda:0").device), str(t.cuda().device)]
    t.record_stream(s)
    report["type"] = [torch.zeros(1).type(), torch.zeros(1, dtype=torch.bfloat16).type()]
    report["type_convert"] = torch.zeros(1).type(torch.float64).dtype == torch.float64

    # A tiny Qwen3-MoE GPTModel, forward and backward, on a world-size-1 gloo group.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = sys.argv[2]
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config

    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.mixed_precision = "fp32"
    resolved = cfg.validate(world_size=1)
    cpu_compat.seed_cpu_model_parallel(1234)
    model = resolved.model.provide()
    seq = resolved.model.seq_length
    tokens = torch.randint(0, resolved.model.vocab_size, (1, seq))
    position_ids = torch.arange(seq).unsqueeze(0)
    mask = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1)
    loss = model(tokens, position_ids, mask, labels=tokens).float().mean()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    report["loss"] = float(loss)
    report["n_grads"] = len(grads)
    report["grads_finite"] = all(bool(torch.isfinite(g).all()) for g in grads)
    report["n_params"] = sum(1 for _ in model.parameters())
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    print("REPORT " + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def child_report(tmp_path_factory, run_child_script) -> dict:
    (report,) = run_child_script(CHILD, tmp_path_factory.mktemp("cpu_compat"))
    return report


def test_not_enabled_until_asked(child_report: dict) -> None:
    assert child_report["enabled_before"] is False
    assert child_report["enabled_after"] is True


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
