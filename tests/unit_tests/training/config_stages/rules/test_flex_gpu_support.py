"""DeepEP against the GPU a config is validated for, as Megatron-Bridge's ``validate()`` judges it, and
the two flex rules that depend on the MoE layers megatron-core builds.

A machine is stated by its rule context (``overlap_helpers.ctx``): compute capability, the device name
torch or ``nvidia-smi`` reports, and whether ``deep_ep`` imports there.
"""

from __future__ import annotations

import pytest
from overlap_helpers import ctx, ep_overlap_cfg, set_fields

from megatron.bridge.training.config_stages.facts.gpu_catalog import resolve_gpu_target
from megatron.bridge.training.config_stages.resolution.finalize import resolve_config
from megatron.bridge.training.config_stages.rules.flex_rules import backend_support

UPSTREAM_DEEPEP_SENTENCE = "DeepEP is supported for Ampere, Hopper, and Blackwell"
"""The start of Megatron-Bridge's validation error for DeepEP on a GPU it does not support."""

DEEPEP = {
    "model.moe_token_dispatcher_type": "flex",
    "model.moe_flex_dispatcher_backend": "deepep",
    "model.moe_shared_expert_overlap": False,
    "comm_overlap.overlap_moe_expert_parallel_comm": False,
}

# device name as reported, capability -> DeepEP runs there (None: cannot tell)
DEEPEP_GPUS = [
    ("NVIDIA A100-SXM4-80GB", (8, 0), True),
    ("NVIDIA H100 80GB HBM3", (9, 0), True),
    ("NVIDIA B200", (10, 0), True),
    ("NVIDIA B200 SXM6 AC", (10, 0), True),
    ("NVIDIA B300", (10, 3), True),
    ("NVIDIA V100-SXM2-32GB", (7, 0), False),
    ("NVIDIA P100", (6, 0), False),
    ("NVIDIA B100", (10, 0), False),
    ("NVIDIA GB200", (10, 0), False),
    (None, (10, 0), None),
]


def _gpu_id(case) -> str:
    return case[0] or f"capability-{case[1][0]}.{case[1][1]}-unnamed"


@pytest.mark.parametrize("name, capability, runs", DEEPEP_GPUS, ids=[_gpu_id(c) for c in DEEPEP_GPUS])
def test_deepep_runs_on_ampere_hopper_and_the_b200_b300_boards_only(name, capability, runs) -> None:
    supported, reason = backend_support("deepep", resolve_gpu_target(capability, name))
    assert supported is runs, reason
    if runs is False:
        assert reason.startswith("DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs")


def test_hybridep_and_ncclep_run_on_any_blackwell_board() -> None:
    b100 = resolve_gpu_target((10, 0), "NVIDIA B100")
    assert backend_support("hybridep", b100)[0] is True and backend_support("ncclep", b100)[0] is True


def _machine(name, capability, deep_ep: bool = True):
    return ctx(device_capability=capability, device_name=name, cuda_available=True, packages={"deep_ep": deep_ep})


@pytest.mark.parametrize(
    "name, capability, runs",
    [c for c in DEEPEP_GPUS if c[2] is not None],
    ids=[_gpu_id(c) for c in DEEPEP_GPUS if c[2] is not None],
)
def test_validate_checks_deepep_against_the_gpu_in_megatron_bridge_s_words(name, capability, runs) -> None:
    """An MoE model on EP=2: valid where DeepEP runs (``deep_ep`` installed), refused elsewhere with
    Megatron-Bridge's sentence among the problems."""
    cfg = set_fields(ep_overlap_cfg(), DEEPEP)
    errors = resolve_config(cfg, ctx=_machine(name, capability)).errors
    if runs:
        assert errors == ()
    else:
        assert [v.rule for v in errors] == ["flex-backend-supported-on-gpu"]
        assert UPSTREAM_DEEPEP_SENTENCE in str(errors[0].format())


def test_a_dense_model_with_the_flex_dispatcher_is_refused_for_what_it_lacks() -> None:
    """No MoE layers: no dispatcher is built, so the setting would do nothing; megatron-core's TP x EP
    assertion (made when it builds one) is not the reason given."""
    cfg = set_fields(ep_overlap_cfg(), {**DEEPEP, "model.num_moe_experts": None, "model.expert_model_parallel_size": 1})
    rules = {v.rule for v in resolve_config(cfg, ctx=_machine("NVIDIA H100 80GB HBM3", (9, 0))).errors}
    assert "flex-dispatcher-needs-moe-layers" in rules and "flex-backend-needs-tp-x-ep" not in rules


def test_deepep_on_an_moe_model_needs_more_than_one_rank_in_tp_x_ep() -> None:
    cfg = set_fields(ep_overlap_cfg(), {**DEEPEP, "model.expert_model_parallel_size": 1})
    errors = resolve_config(cfg, ctx=_machine("NVIDIA H100 80GB HBM3", (9, 0))).errors
    assert [v.rule for v in errors] == ["flex-backend-needs-tp-x-ep"]
