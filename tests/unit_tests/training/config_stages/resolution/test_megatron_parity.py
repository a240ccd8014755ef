"""Parity with megatron-core 0.19.2's own ``TransformerConfig.__post_init__`` overlap checks.

For every EP-overlap / delayed-wgrad rule megatron-core also has, the violating model config is
shown to be rejected by megatron-core too (with its own message), and configs our validator accepts
are accepted by megatron-core. Rules megatron-core does not check are listed in ``OURS_ONLY`` with
the reason; each is shown to be accepted by megatron-core, so a new upstream check shows up here.

Installed versions are emulated by patching megatron-core's ``is_te_min_version`` /
``is_torch_min_version`` as seen by ``transformer_config`` (no GPU, no TE needed).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from megatron.core.transformer import transformer_config as mcore_tc
from overlap_helpers import ctx, ep_overlap_cfg, finalize, set_fields, violated_ids
from packaging.version import Version

from megatron.bridge.training.comm_overlap import OVERLAP_RULES
from megatron.bridge.training.config_stages.resolution.finalize import resolve_config


@contextlib.contextmanager
def emulated_versions(te: str | None = None, torch: str | None = None):
    """Make megatron-core's transformer_config see these TE / torch versions (None: leave as is)."""
    saved = mcore_tc.is_te_min_version, mcore_tc.is_torch_min_version
    if te is not None:
        mcore_tc.is_te_min_version = lambda v, check_equality=True: Version(te) >= Version(v)
    if torch is not None:
        mcore_tc.is_torch_min_version = lambda v, check_equality=True: Version(torch) >= Version(v)
    try:
        yield
    finally:
        mcore_tc.is_te_min_version, mcore_tc.is_torch_min_version = saved


def megatron_error(cfg, context, te: str | None = None, torch: str | None = None) -> str | None:
    """megatron-core's verdict on the model config our resolution produces (``None``: accepted)."""
    work = resolve_config(cfg, ctx=context).effective
    with emulated_versions(te=te, torch=torch):
        try:
            work.model.finalize()
        except (AssertionError, ValueError) as exc:
            return str(exc)
    return None


@dataclass(frozen=True)
class ParityCase:
    rule: str
    change: dict[str, Any]
    megatron_says: str
    """A fragment of megatron-core's own message for this violation."""
    ctx: dict[str, Any] = field(default_factory=dict)
    te: str | None = None
    torch: str | None = None


DW = {"comm_overlap.delay_wgrad_compute": True}
TE_GRAPH = {"model.cuda_graph_impl": "transformer_engine"}

SHARED = [
    ParityCase(
        "ep-overlap-needs-expert-parallel",
        {"model.expert_model_parallel_size": 1},
        "only supported with expert model parallelism",
    ),
    ParityCase(
        "ep-overlap-needs-moe-experts",
        {"model.num_moe_experts": None, "model.moe_ffn_hidden_size": None},
        "num_moe_experts must be non None",
    ),
    ParityCase(
        "ep-overlap-needs-alltoall-or-flex",
        {"model.moe_token_dispatcher_type": "allgather"},
        "alltoall/flex token dispatcher",
    ),
    ParityCase("ep-overlap-needs-bf16-or-fp16", {"mixed_precision": "fp32"}, "bf16 or fp16"),
    ParityCase(
        "ep-overlap-pp-needs-vpp",
        {"model.pipeline_model_parallel_size": 2},
        "virtual_pipeline_model_parallel_size must be specified",
    ),
    ParityCase(
        "ep-overlap-no-full-recompute",
        {"model.recompute_granularity": "full", "model.recompute_method": "uniform", "model.recompute_num_layers": 1},
        "disable full recomputation",
    ),
    ParityCase(
        "ep-overlap-no-recompute-method",
        {"model.recompute_granularity": "selective", "model.recompute_method": "uniform"},
        "disable recomputation method",
    ),
    ParityCase(
        "ep-overlap-no-recompute-num-layers",
        {"model.recompute_granularity": "selective", "model.recompute_num_layers": 1},
        "recompute_num_layers must be None",
    ),
    ParityCase(
        "ep-overlap-no-moe-recompute",
        {"model.recompute_granularity": "selective", "model.recompute_modules": ["moe"]},
        "disable moe in recompute_modules",
    ),
    ParityCase(
        "ep-overlap-no-shared-expert-overlap",
        {"model.moe_shared_expert_overlap": True},
        "disable moe_shared_expert_overlap",
    ),
    ParityCase("ep-overlap-max-one-mtp-layer", {"model.mtp_num_layers": 2}, "MTP supports at most one layer"),
    ParityCase(
        "ep-overlap-needs-torch-2.6", {}, "torch version < 2.6.0", ctx={"torch_version": "2.5.1"}, torch="2.5.1"
    ),
    ParityCase(
        "ep-overlap-te-cuda-graph-scope",
        {
            **TE_GRAPH,
            "model.cuda_graph_modules": ["moe"],
            "model.moe_expert_capacity_factor": 1.0,
            "model.moe_pad_expert_input_to_capacity": True,
        },
        "CUDA graph scope on moe and mlp",
        ctx={"te_version": "2.12"},
        te="2.12",
    ),
    ParityCase(
        "ep-overlap-te-cuda-graph-scope",
        {**TE_GRAPH, "model.cuda_graph_modules": ["mlp"], "model.moe_layer_freq": [1, 0, 1, 0]},
        "CUDA graph scope on moe and mlp",
        ctx={"te_version": "2.12"},
        te="2.12",
    ),
    ParityCase(
        "ep-overlap-excludes-dispatch-wgrad-overlap",
        {"model.overlap_dispatch_backward_with_experts_wgrad": True},
        "must be disabled when enabling overlap_dispatch_backward_with_experts_wgrad",
    ),
    ParityCase(
        "delay-wgrad-needs-ep-overlap",
        {**DW, "comm_overlap.overlap_moe_expert_parallel_comm": False},
        "must be enabled when enabling delay_wgrad_compute",
    ),
    ParityCase(
        "delay-wgrad-te-cuda-graph-te-2.10",
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["moe_router"]},
        "TE version >= 2.10.0",
        ctx={"te_version": "2.9"},
        te="2.9",
    ),
]

OURS_ONLY: dict[str, tuple[str, ParityCase]] = {
    "ep-overlap-needs-moe-experts": (
        "megatron-core only requires num_moe_experts to be set for EP; one expert passes its overlap checks",
        ParityCase(
            "ep-overlap-needs-moe-experts", {"model.num_moe_experts": 1, "model.expert_model_parallel_size": 2}, ""
        ),
    ),
    "ep-overlap-needs-two-micro-batches": (
        "a warning about the batch shape; megatron-core's model config does not know the batch",
        ParityCase("ep-overlap-needs-two-micro-batches", {"train.global_batch_size": 2}, ""),
    ),
    "delay-wgrad-no-op-with-local-layers": (
        "a warning (delayed wgrad is a no-op with the local layers); megatron-core accepts it",
        ParityCase("delay-wgrad-no-op-with-local-layers", {**DW, "model.layer_spec": "local"}, ""),
    ),
    "delay-wgrad-te-2.7": (
        "TE >= 2.7 with overlapped grad reduce / grad-accumulation fusion: not checked by megatron-core 0.19.2",
        ParityCase(
            "delay-wgrad-te-2.7",
            {**DW, "comm_overlap.overlap_grad_reduce": True},
            "",
            ctx={"te_version": "2.6"},
            te="2.6",
        ),
    ),
    "delay-wgrad-graph-scope-te-2.12": (
        "megatron-core 0.19.2 asks only TE >= 2.10 for delayed wgrad with TE graphs",
        ParityCase(
            "delay-wgrad-graph-scope-te-2.12",
            {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["attn"], "model.gradient_accumulation_fusion": True},
            "",
            ctx={"te_version": "2.11"},
            te="2.11",
        ),
    ),
    "delay-wgrad-graph-scope-needs-grad-accum-fusion": (
        "part of the documented TE >= 2.12 graph-scope rule; not in megatron-core 0.19.2",
        ParityCase(
            "delay-wgrad-graph-scope-needs-grad-accum-fusion",
            {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["attn"]},
            "",
            ctx={"te_version": "2.12"},
            te="2.12",
        ),
    ),
    "delay-wgrad-graph-scope-no-attention-bias": (
        "part of the documented TE >= 2.12 graph-scope rule; not in megatron-core 0.19.2",
        ParityCase(
            "delay-wgrad-graph-scope-no-attention-bias",
            {
                **DW,
                **TE_GRAPH,
                "model.cuda_graph_modules": ["attn"],
                "model.add_qkv_bias": True,
                "model.gradient_accumulation_fusion": True,
            },
            "",
            ctx={"te_version": "2.12"},
            te="2.12",
        ),
    ),
}

EP_DW_RULES = {r.id for r in OVERLAP_RULES if r.group in ("ep-overlap", "delay-wgrad")}


def test_every_ep_and_delay_wgrad_rule_is_covered() -> None:
    shared = {c.rule for c in SHARED}
    ours_only_strict = set(OURS_ONLY) - shared
    assert shared | ours_only_strict == EP_DW_RULES
    for rule, (reason, _) in OURS_ONLY.items():
        assert reason, rule


@pytest.mark.parametrize("case", SHARED, ids=lambda c: c.rule)
def test_megatron_core_rejects_what_we_reject(case: ParityCase) -> None:
    cfg = set_fields(ep_overlap_cfg(), case.change)
    context = ctx(**case.ctx)
    assert case.rule in violated_ids(cfg, context)
    message = megatron_error(cfg, context, te=case.te, torch=case.torch)
    assert message is not None, f"megatron-core accepted a config violating {case.rule}"
    assert case.megatron_says in message


@pytest.mark.parametrize("rule", sorted(OURS_ONLY))
def test_ours_only_rules_are_not_in_megatron_core(rule: str) -> None:
    _, case = OURS_ONLY[rule]
    cfg = set_fields(ep_overlap_cfg(), case.change)
    context = ctx(**case.ctx)
    assert case.rule in violated_ids(cfg, context)
    assert megatron_error(cfg, context, te=case.te, torch=case.torch) is None, (
        f"megatron-core now checks {rule}: move it to SHARED"
    )


ACCEPTED = [
    ({}, {}, None),
    (
        {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2},
        {"world_size": 4},
        None,
    ),
    ({"model.recompute_granularity": "selective", "model.recompute_modules": ["moe_act"]}, {}, None),
    ({"mixed_precision": "fp16_mixed"}, {}, None),
    ({"model.mtp_num_layers": 1}, {}, None),
    ({**DW}, {"te_version": "2.12"}, "2.12"),
    ({**DW, **TE_GRAPH, "model.cuda_graph_modules": ["moe_router"]}, {"te_version": "2.12"}, "2.12"),
    (
        {"model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "hybridep"},
        {"device_capability": (10, 0), "device_name": "gb200"},
        None,
    ),
]


PACKAGE_REFUSALS = {"model.mtp_num_layers": "mtp-not-built", "model.cuda_graph_impl": "cuda-graph-impl-captured"}
"""Settings the overlap rules (and megatron-core) accept but this package refuses as a whole: its
provider builds no MTP block and its loop captures no per-layer CUDA graphs."""


@pytest.mark.parametrize("change, context, te", ACCEPTED, ids=[str(i) for i in range(len(ACCEPTED))])
def test_megatron_core_accepts_what_we_accept(change, context, te) -> None:
    from megatron.bridge.training.errors import ConfigValidationError

    cfg = set_fields(ep_overlap_cfg(), change)
    rule_ctx = ctx(**context)
    errors = [
        v
        for v in violated_ids(cfg, rule_ctx)
        if not v.startswith(("delay-wgrad-no-op-with-local-layers", "flex-deep-ep"))
    ]
    assert errors == []
    assert megatron_error(cfg, rule_ctx, te=te) is None
    refused = {rule for key, rule in PACKAGE_REFUSALS.items() if key in change}
    if refused:
        with pytest.raises(ConfigValidationError) as info, emulated_versions(te=te):
            finalize(cfg, rule_ctx)
        assert {v.rule for v in info.value.violations} == refused
        return
    with emulated_versions(te=te):
        resolved = finalize(cfg, rule_ctx)  # our finalize runs megatron-core's checks after ours
    assert resolved.model.overlap_moe_expert_parallel_comm is True


def test_megatron_only_check_still_surfaces_as_typed_error() -> None:
    """A check only megatron-core has (padding to capacity needs a capacity factor) is turned into a
    typed error by finalize, never a bare raise."""
    from megatron.bridge.training.errors import ConfigValidationError

    cfg = set_fields(ep_overlap_cfg(), {"model.moe_pad_expert_input_to_capacity": True})
    assert violated_ids(cfg) == set()
    with pytest.raises(ConfigValidationError) as info:
        finalize(cfg)
    assert info.value.violations[0].rule == "megatron-core-post-init"
