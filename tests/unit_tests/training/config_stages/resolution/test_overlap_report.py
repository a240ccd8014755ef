"""Start-up overlap report: active/refused features, dispatcher, layer spec, CUDA_DEVICE_MAX_CONNECTIONS."""

from __future__ import annotations

import json

import pytest
from overlap_helpers import ctx, ep_overlap_cfg, finalize, set_fields

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_8gpu_config, qwen3_30b_a3b_pretrain_config
from megatron.bridge.training.config_stages.resolution.finalize import resolve_config
from megatron.bridge.training.config_stages.resolution.overlap_report import EP_OVERLAP_MAX_CONNECTIONS


def build_overlap_report(cfg, context=None):
    """The report of one resolution of ``cfg`` (default context: this machine, ``dist.target_gpu``)."""
    return resolve_config(cfg, ctx=context).report


H100 = {"device_capability": (9, 0), "device_name": "h100"}
B200 = {"device_capability": (10, 0), "device_name": "b200"}


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)


def _tp_ep_cfg():
    """The 8-GPU layout (TP4/PP2/EP4) with EP overlap and VPP: valid, and TP wants 1 connection."""
    cfg = qwen3_30b_a3b_pretrain_8gpu_config()
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    cfg.model.virtual_pipeline_model_parallel_size = 2
    return cfg


def test_active_ep_overlap_on_resolved_config() -> None:
    resolved = finalize(ep_overlap_cfg(), ctx(world_size=4))
    report = build_overlap_report(resolved, ctx(world_size=4))
    assert "moe_ep_overlap" in report.active and not report.refused
    assert report.feature("moe_ep_overlap").source == "recipe"
    assert report.cuda_device_max_connections == EP_OVERLAP_MAX_CONNECTIONS
    assert report.cuda_device_max_connections_conflict is None
    assert report.dispatcher == "alltoall" and report.flex_backend is None
    assert report.errors == ()


def test_report_does_not_change_config() -> None:
    cfg = ep_overlap_cfg()
    build_overlap_report(cfg, ctx())
    assert cfg.model.overlap_moe_expert_parallel_comm is False and cfg.comm_overlap.overlap_grad_reduce is None


def test_refused_feature_says_why() -> None:
    cfg = set_fields(ep_overlap_cfg(), {"model.pipeline_model_parallel_size": 2})
    report = build_overlap_report(cfg, ctx(world_size=4))
    (refused,) = report.refused
    assert refused.name == "moe_ep_overlap"
    assert any("virtual_pipeline_model_parallel_size" in r for r in refused.reasons)
    assert report.cuda_device_max_connections is None  # the overlap will not run
    assert "REFUSED moe_ep_overlap" in report.format()


def test_delay_wgrad_refused_with_its_parent() -> None:
    cfg = set_fields(
        ep_overlap_cfg(), {"model.expert_model_parallel_size": 1, "comm_overlap.delay_wgrad_compute": True}
    )
    report = build_overlap_report(cfg, ctx())
    assert {f.name for f in report.refused} == {"moe_ep_overlap", "delay_wgrad"}
    assert any("moe_ep_overlap" in r for r in report.feature("delay_wgrad").reasons)


def test_delay_wgrad_on_local_layers_is_a_note() -> None:
    cfg = set_fields(ep_overlap_cfg(), {"comm_overlap.delay_wgrad_compute": True, "model.layer_spec": "local"})
    report = build_overlap_report(cfg, ctx())
    state = report.feature("delay_wgrad")
    assert state.active and any("buys nothing" in r for r in state.reasons)
    assert "note on delay_wgrad" in report.format()


def test_delay_wgrad_without_te_uses_torch_native_experts() -> None:
    report = build_overlap_report(set_fields(ep_overlap_cfg(), {"comm_overlap.delay_wgrad_compute": True}), ctx())
    state = report.feature("delay_wgrad")
    assert state.active and not any("buys nothing" in r for r in state.reasons)
    assert "layer spec: torch_native (auto: Transformer Engine absent)" in report.format()


def test_ep_overlap_and_tp_conflict_on_hopper() -> None:
    report = build_overlap_report(_tp_ep_cfg(), ctx(world_size=8, **H100))
    assert report.cuda_device_max_connections == EP_OVERLAP_MAX_CONNECTIONS
    assert "TP/CP" in report.cuda_device_max_connections_conflict
    assert "CONFLICT" in report.format()


def test_no_conflict_on_blackwell() -> None:
    report = build_overlap_report(_tp_ep_cfg(), ctx(world_size=8, **B200))
    assert report.cuda_device_max_connections == EP_OVERLAP_MAX_CONNECTIONS
    assert report.cuda_device_max_connections_conflict is None


def test_tp_without_ep_overlap_wants_one_on_hopper() -> None:
    report = build_overlap_report(qwen3_30b_a3b_pretrain_8gpu_config(), ctx(world_size=8, **H100))
    assert report.cuda_device_max_connections == 1 and "pre-Blackwell" in report.cuda_device_max_connections_reason


def test_nothing_constrains_connections_without_overlap() -> None:
    report = build_overlap_report(qwen3_30b_a3b_pretrain_config(), ctx(world_size=16, **B200))
    assert report.cuda_device_max_connections is None


def test_environment_mismatch_is_reported(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    report = build_overlap_report(ep_overlap_cfg(), ctx())
    assert report.cuda_device_max_connections_env == "1" and report.cuda_device_max_connections_env_mismatch
    assert "WARNING: CUDA_DEVICE_MAX_CONNECTIONS=1" in report.format()


def test_flex_backend_and_gpu_in_report() -> None:
    cfg = set_fields(
        ep_overlap_cfg(), {"model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "hybridep"}
    )
    report = build_overlap_report(cfg, ctx(device_capability=(10, 0), device_name="gb200"))
    assert report.feature("flex_dispatcher").active
    assert report.flex_backend == "hybridep" and "gb200" in report.target_gpu
    assert "dispatcher: flex, backend hybridep" in report.format()


def test_flex_backend_without_flex_dispatcher_is_refused() -> None:
    cfg = set_fields(ep_overlap_cfg(), {"model.moe_flex_dispatcher_backend": "deepep"})
    report = build_overlap_report(cfg, ctx(**H100))
    assert [f.name for f in report.refused] == ["flex_dispatcher"]
    assert report.flex_backend is None


@pytest.mark.parametrize(
    "fields, te_version, layer_spec, reason",
    [
        ({}, None, "torch_native", "auto: Transformer Engine absent"),
        ({}, "2.12", "torch_native", "no feature here needs Transformer Engine"),
        ({"mixed_precision": "bf16_with_fp8_current_scaling_mixed"}, "2.12", "transformer_engine", "FP8 compute"),
        ({"dist.device": "cpu"}, "2.12", "torch_native", "a CPU run"),
        ({"model.layer_spec": "local"}, None, "local", "requested"),
    ],
)
def test_layer_spec_and_its_reason(fields, te_version, layer_spec, reason) -> None:
    report = build_overlap_report(set_fields(ep_overlap_cfg(), fields), ctx(te_version=te_version))
    assert (report.layer_spec, report.transformer_engine) == (layer_spec, te_version or "absent")
    assert reason in report.layer_spec_reason
    assert report.layer_spec_line == f"layer spec: {layer_spec} ({report.layer_spec_reason})"
    assert report.to_dict()["layer_spec_reason"] == report.layer_spec_reason


def test_to_dict_is_json() -> None:
    cfg = set_fields(ep_overlap_cfg(), {"model.pipeline_model_parallel_size": 2})
    data = json.loads(json.dumps(build_overlap_report(cfg, ctx(world_size=4)).to_dict()))
    assert "moe_ep_overlap" in data["refused"]
    assert data["effective"]["comm_overlap.overlap_moe_expert_parallel_comm"] == {"value": True, "source": "recipe"}
    assert data["features"]["moe_ep_overlap"]["requested"] is True
    assert "cuda_device_max_connections" in data


def test_default_context_reads_target_gpu_from_config() -> None:
    cfg = _tp_ep_cfg()
    cfg.dist.target_gpu = "h100"
    report = build_overlap_report(cfg)
    assert report.target_gpu.startswith("h100")


def test_copy_written_against_its_owner_is_listed() -> None:
    cfg = ep_overlap_cfg()
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = False
    cfg.model.overlap_moe_expert_parallel_comm = True
    report = build_overlap_report(cfg, ctx())
    assert [v.rule for v in report.errors] == ["owned-field-set-directly"]
    assert "owned-field-set-directly" in report.format()


def test_report_leaves_general_rules_to_the_validator() -> None:
    """The start-up report speaks of overlap features; a general problem is the validator's error."""
    cfg = set_fields(ep_overlap_cfg(), {"train.train_iters": 0})
    resolution = resolve_config(cfg, ctx=ctx())
    assert "range:train.train_iters" in {v.rule for v in resolution.errors}
    assert resolution.report.errors == () and "moe_ep_overlap" in resolution.report.active
