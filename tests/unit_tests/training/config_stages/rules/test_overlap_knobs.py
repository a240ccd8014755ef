"""megatron-core 0.19.2's EP-overlap, flex-dispatch and activation-memory knobs, through the entry
points a user has: ``cfg.validate()`` and the harness (``--dryrun``). Each bad setting is refused
before launch naming its rule and field, all of them at once; the settings that run are accepted and
reported at start-up. (The rules' own table, one violating and one satisfying case per rule, is in
``test_comm_overlap.py``; the CPU training of ``ep_overlap_early_attn_memory_release`` is in
``tests/functional_tests/test_cpu_training.py``; offloading on a GPU in ``tests/gpu``.)"""

from __future__ import annotations

import io
from typing import Any

import pytest
from overlap_helpers import ep_overlap_cfg, set_fields

from megatron.bridge.perf.harness.run import main
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.devices.platform import select_platform
from megatron.bridge.training.errors import CommOverlapConfigError

TINY = ["-m", "qwen", "-mr", "qwen3_moe_tiny", "--task", "pretrain", "-ng", "2", "-ep", "2", "--max_steps", "3"]
NCCLEP = {
    "model.moe_token_dispatcher_type": "flex",
    "model.moe_flex_dispatcher_backend": "ncclep",
    "model.moe_expert_rank_capacity_factor": 1.5,
}
OFFLOAD = {"model.fine_grained_activation_offloading": True}

# knob -> (settings on the tiny EP-overlap config, target GPU, rule that refuses them, field it names)
REFUSED: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "ep_overlap_early_attn_memory_release": (
        {"comm_overlap.overlap_moe_expert_parallel_comm": False, "model.ep_overlap_early_attn_memory_release": True},
        "h100",
        "ep-early-attn-release-needs-ep-overlap",
        "model.ep_overlap_early_attn_memory_release",
    ),
    "overlap_dispatch_backward_with_experts_wgrad": (
        {
            "comm_overlap.overlap_moe_expert_parallel_comm": False,
            "model.overlap_dispatch_backward_with_experts_wgrad": True,
        },
        "h100",
        "dispatch-wgrad-overlap-not-built",
        "model.overlap_dispatch_backward_with_experts_wgrad",
    ),
    "moe_paged_stash": ({"model.moe_paged_stash": True}, "h100", "paged-stash-not-built", "model.moe_paged_stash"),
    "moe_paged_stash_page_size": (
        {"model.moe_paged_stash_page_size": 128},
        "h100",
        "paged-stash-sizes-need-paged-stash",
        "model.moe_paged_stash_page_size",
    ),
    "fine_grained_activation_offloading": (
        {**OFFLOAD, "model.offload_modules": ["core_attn"]},
        "h100",
        "activation-offload-torch-native-norms-only",
        "model.offload_modules",
    ),
    "offload_modules": (
        {"model.offload_modules": ["attn_norm"]},
        "h100",
        "offload-modules-need-activation-offload",
        "model.offload_modules",
    ),
    "moe_flex_dispatcher_num_sms": (
        {"model.moe_flex_dispatcher_num_sms": 24},
        "h100",
        "flex-num-sms-needs-flex-dispatcher",
        "model.moe_flex_dispatcher_num_sms",
    ),
    "moe_deepep_num_sms": (
        {
            "model.moe_token_dispatcher_type": "flex",
            "model.moe_flex_dispatcher_backend": "deepep",
            "model.moe_deepep_num_sms": 21,
        },
        "h100",
        "deepep-num-sms-even",
        "model.moe_deepep_num_sms",
    ),
    "moe_hybridep_num_sms": (
        {
            "model.moe_token_dispatcher_type": "flex",
            "model.moe_flex_dispatcher_backend": "hybridep",
            "model.moe_hybridep_num_sms": 16,
            "model.moe_flex_dispatcher_num_sms": 32,
        },
        "h100",
        "flex-num-sms-one-value",
        "model.moe_hybridep_num_sms",
    ),
    "moe_expert_rank_capacity_factor": (
        {"model.moe_expert_rank_capacity_factor": 1.5},
        "h100",
        "rank-capacity-factor-needs-hybridep-or-ncclep",
        "model.moe_expert_rank_capacity_factor",
    ),
    "ncclep": (
        {**NCCLEP, "model.moe_expert_rank_capacity_factor": None},
        "gb200",
        "ncclep-needs-rank-capacity-factor",
        "model.moe_expert_rank_capacity_factor",
    ),
    "ncclep_on_ampere": (NCCLEP, "a100", "flex-backend-supported-on-gpu", "model.moe_flex_dispatcher_backend"),
}


def _cfg(settings: dict[str, Any], gpu: str) -> ConfigContainer:
    cfg = set_fields(ep_overlap_cfg(), settings)
    cfg.dist.target_gpu = gpu
    return cfg


@pytest.mark.parametrize("knob", REFUSED)
def test_cfg_validate_refuses_each_knob_with_its_rule_and_field(knob: str) -> None:
    settings, gpu, rule, field = REFUSED[knob]
    with pytest.raises(CommOverlapConfigError) as info:
        _cfg(settings, gpu).validate(world_size=2)
    found = [v for v in info.value.violations if v.rule == rule]
    assert found and field in found[0].fields, str(info.value)


def test_cfg_validate_lists_every_refused_knob_at_once() -> None:
    settings = {
        "comm_overlap.overlap_moe_expert_parallel_comm": False,
        "model.ep_overlap_early_attn_memory_release": True,
        "model.overlap_dispatch_backward_with_experts_wgrad": True,
        "model.moe_paged_stash": True,
        "model.fine_grained_activation_offloading": True,
        "model.offload_modules": ["qkv_linear"],
        "model.moe_flex_dispatcher_num_sms": 24,
        "model.moe_expert_rank_capacity_factor": 1.5,
    }
    with pytest.raises(CommOverlapConfigError) as info:
        _cfg(settings, "h100").validate(world_size=2)
    assert {
        "ep-early-attn-release-needs-ep-overlap",
        "dispatch-wgrad-overlap-not-built",
        "paged-stash-not-built",
        "activation-offload-torch-native-norms-only",
        "flex-num-sms-needs-flex-dispatcher",
        "rank-capacity-factor-needs-hybridep-or-ncclep",
    } <= {v.rule for v in info.value.violations}


def _dry_run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main([*TINY, *argv, "--dryrun"], out=out)
    return code, out.getvalue()


def test_the_harness_refuses_every_bad_knob_before_launch(tmp_path) -> None:
    code, out = _dry_run(
        "-g",
        "h100",
        "-l",
        str(tmp_path / "run"),
        "--moe_a2a_overlap",
        "false",
        "model.ep_overlap_early_attn_memory_release=true",
        "model.moe_paged_stash=true",
        "model.moe_flex_dispatcher_num_sms=24",
        "model.offload_modules=[attn_norm]",
    )
    assert code == 2, out
    for rule in (
        "ep-early-attn-release-needs-ep-overlap",
        "paged-stash-not-built",
        "flex-num-sms-needs-flex-dispatcher",
        "offload-modules-need-activation-offload",
    ):
        assert f"[{rule}]" in out
    assert "nothing was launched" in out


# --moe_flex_dispatcher_backend ncclep as a user runs it: accepted with its prerequisites, the dispatch
# path it runs said in the report; refused where it cannot run, in upstream's words where they exist.
NCCLEP_DRY_RUNS = [
    pytest.param(
        ["-g", "gb200", "model.moe_expert_rank_capacity_factor=1.5"],
        0,
        [
            "dispatcher: flex, backend ncclep (sized per step (host sync), zero copy off, per-rank capacity "
            "factor 1.5, SMs: backend default)",
            "NCCL EP module does not import on this CPU host; the GPU machines must have it",
        ],
        id="gb200",
        marks=pytest.mark.host("cpu"),
    ),  # a dry run on a CPU login node
    pytest.param(
        [
            "-g",
            "h100",
            "--moe_a2a_overlap",
            "true",
            "model.moe_expert_rank_capacity_factor=1.25",
            "model.moe_flex_dispatcher_num_sms=24",
        ],
        0,
        [
            "backend ncclep (sized per step (host sync), zero copy off, per-rank capacity factor 1.25, SMs: 24)",
            "which serialises the EP-overlap schedule",
        ],
        id="h100-ep-overlap",
        marks=pytest.mark.host("cpu"),
    ),
    pytest.param(
        ["-g", "h100", "model.moe_expert_rank_capacity_factor=1.25"],
        2,
        ["[ncclep-needs-te-nccl-ep]", "host='GPU host'"],
        id="h100-host-without-te",
        marks=pytest.mark.host("h100", transformer_engine=None),
    ),
    pytest.param(
        ["-g", "h100", "model.moe_expert_rank_capacity_factor=1.25"],
        0,
        ["backend ncclep (sized per step (host sync)"],
        id="h100-host-with-te-nccl-ep",
        marks=pytest.mark.host("h100", transformer_engine="2.20.2", packages=("transformer_engine.pytorch.ep",)),
    ),
    pytest.param(
        ["-g", "a100", "model.moe_expert_rank_capacity_factor=1.5"],
        2,
        [
            "[flex-backend-supported-on-gpu]",
            "NCCL EP is supported for Hopper and Blackwell GPUs",
            "NCCL EP is only applicable to Hopper and Blackwell GPUs",
        ],
        id="a100",
    ),
    pytest.param(["-g", "gb200"], 2, ["[ncclep-needs-rank-capacity-factor]"], id="no-capacity-factor"),
    pytest.param(
        ["-g", "gb200", "model.moe_expert_rank_capacity_factor=1.5", "model.moe_ncclep_zero_copy=true"],
        2,
        ["[ncclep-zero-copy-needs-static-shape]"],
        id="zero-copy-without-static-shape",
    ),
    pytest.param(
        ["-g", "gb200", "model.moe_expert_rank_capacity_factor=1.5", "model.moe_ncclep_static_shape=true"],
        2,
        ["[ncclep-static-shape-needs-fused-grouped-experts]"],
        id="static-shape-torch-native-experts",
    ),
    pytest.param(
        ["-g", "cpu", "model.moe_expert_rank_capacity_factor=1.5"],
        2,
        ["[cpu-mode-no-flex-dispatcher]", "NCCL EP"],
        id="cpu-mode",
    ),
]


@pytest.mark.parametrize("argv, code, says", NCCLEP_DRY_RUNS)
def test_ncclep_through_the_harness(argv: list[str], code: int, says: list[str], tmp_path) -> None:
    got, out = _dry_run("--moe_flex_dispatcher_backend", "ncclep", "-l", str(tmp_path / "run"), *argv)
    assert got == code, out
    for text in says:
        assert text in out, text


def test_early_attention_release_is_reported_active_with_ep_overlap(tmp_path) -> None:
    code, out = _dry_run(
        "-g",
        "h100",
        "-l",
        str(tmp_path / "run"),
        "--moe_a2a_overlap",
        "true",
        "model.ep_overlap_early_attn_memory_release=true",
    )
    assert code == 0, out
    active = out.split("active:", 1)[1].splitlines()[0]
    assert "moe_ep_overlap" in active and "ep_early_attn_release" in active


@pytest.mark.parametrize(
    "layer_spec, modules",
    [
        ("local", ["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"]),
        ("torch_native", ["attn_norm", "mlp_norm"]),
    ],
)
def test_offloading_what_trained_on_a_gpu_is_accepted_and_reported(layer_spec: str, modules: list[str]) -> None:
    cfg = _cfg({**OFFLOAD, "model.offload_modules": modules, "model.layer_spec": layer_spec}, "h100")
    resolution = cfg.resolve(world_size=2)
    assert resolution.config.model.fine_grained_activation_offloading is True
    assert "activation_offload" in resolution.report.active


def test_a_gpu_run_that_offloads_gets_the_flag_megatron_core_sets(monkeypatch) -> None:
    """Without Transformer Engine megatron-core would stop at the first offloaded module ("TE CPU
    offload is not available"); the GPU platform gives it the flag it sets, and only for such a run."""
    from megatron.core.extensions import transformer_engine as te_extension

    monkeypatch.setattr(te_extension, "cpu_offload", None)  # as without Transformer Engine
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    cfg = _cfg({**OFFLOAD, "model.offload_modules": ["attn_norm"]}, "h100")
    resolution = cfg.resolve(world_size=2)
    select_platform(resolution.config).prepare_process(resolution.report)
    from megatron.core.extensions.transformer_engine import cpu_offload  # what megatron-core's manager does

    cpu_offload.CPUOffloadEnabled = True
    assert te_extension.cpu_offload is cpu_offload
