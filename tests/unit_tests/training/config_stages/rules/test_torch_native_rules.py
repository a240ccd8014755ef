"""Every rule of the torch-native fields (token dispatch and kernels) has a passing and a failing case
(table-driven, as the general rules)."""

import io

import pytest
from overlap_helpers import set_fields, violated_rule_ids
from packaging.version import Version

from megatron.bridge.perf.harness.run import main
from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config
from megatron.bridge.training.config_stages.rules.dispatch_rules import TORCH_NATIVE_DISPATCH_RULES
from megatron.bridge.training.config_stages.rules.kernel_rules import TORCH_NATIVE_KERNEL_RULES
from megatron.bridge.training.errors import ConfigValidationError

RULES = TORCH_NATIVE_DISPATCH_RULES + TORCH_NATIVE_KERNEL_RULES
TE_ABSENT = dict(te_version=None)
TE_PRESENT = dict(te_version=Version("2.12.0"))
HOPPER = dict(te_version=None, device_capability=(9, 0))
AMPERE = dict(te_version=None, device_capability=(8, 0))


def _set(**changes):
    """A mutation of a recipe config: dotted path -> value."""
    return lambda cfg: set_fields(cfg, changes)


M = "model."
GG, CE, COMPILE = (
    M + "torch_native_grouped_gemm_backend",
    M + "torch_native_cross_entropy_backend",
    M + "torch_native_compile",
)
WA = M + "torch_native_wgrad_accumulation"
NA, GPN, EP = M + "torch_native_dispatcher", M + "torch_native_gpus_per_node", M + "expert_model_parallel_size"
BF16 = {M + "bf16": True}
CS = M + "moe_chunk_sort"
GATHER_EP16 = {CS: "gather", EP: 16, NA: "megatron"}
RCF = M + "torch_native_rank_capacity_factor"
SORTED_EP16 = {NA: "sorted", EP: 16}
# rule id -> (context facts, mutation that breaks the rule, mutation that satisfies it)
CASES = {
    "torch-native-dispatcher-known": (
        TE_ABSENT,
        _set(**{M + "torch_native_dispatcher": "fast"}),
        _set(**{M + "torch_native_dispatcher": "megatron"}),
    ),
    "torch-native-ep-transport-known": (
        TE_ABSENT,
        _set(**{M + "torch_native_ep_transport": "ib"}),
        _set(**{M + "torch_native_ep_transport": "nccl"}),
    ),
    "torch-native-dispatch-needs-torch-native-layers": (
        TE_PRESENT,
        _set(**{M + "torch_native_dispatcher": "sorted", M + "layer_spec": "transformer_engine"}),
        _set(**{M + "torch_native_dispatcher": "sorted", M + "layer_spec": "torch_native"}),
    ),
    "sorted-dispatch-must-be-exact": (
        TE_ABSENT,
        _set(**{M + "torch_native_dispatcher": "sorted", M + "moe_expert_capacity_factor": 1.25}),
        _set(**{M + "torch_native_dispatcher": "sorted"}),
    ),
    "ep-transport-needs-sorted-ep-dispatch": (
        TE_ABSENT,
        _set(**{M + "torch_native_ep_transport": "nvshmem", M + "torch_native_dispatcher": "megatron"}),
        _set(**{M + "torch_native_ep_transport": "nvshmem"}),
    ),
    "rank-capacity-factor-at-least-one": (
        TE_ABSENT,
        _set(**{**SORTED_EP16, RCF: 0.8}),
        _set(**{**SORTED_EP16, RCF: 1.0}),
    ),
    "rank-capacity-factor-needs-sorted-ep-dispatch": (
        TE_ABSENT,
        _set(**{RCF: 2.0, EP: 16}),  # auto: megatron-core's dispatcher at EP > 1
        _set(**{**SORTED_EP16, RCF: 2.0}),
    ),
    "nvshmem-blocks-in-range": (
        TE_ABSENT,
        _set(**{M + "torch_native_nvshmem_blocks": 12}),
        _set(**{M + "torch_native_nvshmem_blocks": 16}),
    ),
    "node-aware-dispatch-needs-gpus-per-node": (
        TE_ABSENT,
        _set(**{NA: "node_aware"}),
        _set(**{NA: "node_aware", GPN: 8}),
    ),
    "gpus-per-node-divides-ep-size": (
        TE_ABSENT,
        _set(**{NA: "node_aware", GPN: 6}),
        _set(**{NA: "node_aware", GPN: 8}),
    ),
    "node-aware-dispatch-needs-ep": (
        TE_ABSENT,
        _set(**{NA: "node_aware", GPN: 8, EP: 1}),
        _set(**{NA: "node_aware", GPN: 8, EP: 2}),
    ),
    "node-aware-dispatch-must-be-exact": (
        TE_ABSENT,
        _set(**{NA: "node_aware", GPN: 8, M + "moe_expert_capacity_factor": 1.25}),
        _set(**{NA: "node_aware", GPN: 8}),
    ),
    "node-aware-dispatch-takes-no-sorted-transport": (
        TE_ABSENT,
        _set(**{NA: "node_aware", GPN: 8, M + "torch_native_ep_transport": "nccl"}),
        _set(**{NA: "node_aware", GPN: 8}),
    ),
    "gpus-per-node-needs-node-aware-dispatch": (
        TE_ABSENT,
        _set(**{NA: "sorted", GPN: 8}),
        _set(**{NA: "node_aware", GPN: 8}),
    ),
    "node-aware-gpus-per-node-matches-emulated-network": (
        TE_ABSENT,
        _set(**{NA: "node_aware", GPN: 4, "emulation.world_size": 16}),  # h100_ib400: 8 per node
        _set(**{NA: "node_aware", GPN: 4, "emulation.world_size": 16, "emulation.gpus_per_node": 4}),
    ),
    "moe-chunk-sort-known": (TE_ABSENT, _set(**{CS: "triton"}), _set(**{CS: "gather"})),
    "moe-chunk-sort-gather-needs-alltoall-dispatcher": (
        TE_ABSENT,
        _set(**{**GATHER_EP16, M + "moe_token_dispatcher_type": "allgather"}),
        _set(**GATHER_EP16),
    ),
    "moe-chunk-sort-gather-needs-unfused-permute": (
        TE_PRESENT,
        _set(**{**GATHER_EP16, M + "moe_permute_fusion": True}),
        _set(**{**GATHER_EP16, M + "moe_permute_fusion": False}),
    ),
    "moe-chunk-sort-gather-needs-local-experts": (
        TE_ABSENT,
        _set(**{**GATHER_EP16, M + "num_moe_experts": 16}),  # one expert a GPU: nothing to reorder
        _set(**{**GATHER_EP16, M + "num_moe_experts": 32}),
    ),
    "moe-chunk-sort-gather-needs-dropless": (
        TE_ABSENT,
        _set(**{**GATHER_EP16, M + "moe_expert_capacity_factor": 1.0, M + "moe_pad_expert_input_to_capacity": True}),
        _set(**{**GATHER_EP16, M + "moe_expert_capacity_factor": 1.0}),
    ),
    "moe-chunk-sort-gather-needs-megatron-dispatcher": (
        TE_ABSENT,
        _set(**{**GATHER_EP16, NA: "sorted"}),  # the torch-native layers sort in their own dispatcher
        _set(**{**GATHER_EP16, NA: "auto"}),  # auto keeps megatron's at EP > 1
    ),
    "torch-native-grouped-gemm-backend-known": (TE_ABSENT, _set(**{GG: "cutlass"}), _set(**{GG: "loop"})),
    "torch-native-cross-entropy-backend-known": (TE_ABSENT, _set(**{CE: "cudnn"}), _set(**{CE: "torch"})),
    "torch-native-kernel-settings-need-torch-native-layers": (
        TE_PRESENT,
        _set(**{COMPILE: False, M + "layer_spec": "transformer_engine"}),
        _set(**{COMPILE: False, M + "layer_spec": "auto"}),
    ),
    "torch-native-compile-off-needs-cuda": (
        TE_ABSENT,
        _set(**{COMPILE: False, "dist.device": "cpu"}),
        _set(**{COMPILE: False}),
    ),
    "grouped-mm-needs-hopper-bf16": (AMPERE, _set(**{GG: "grouped_mm", **BF16}), _set(**{GG: "loop", **BF16})),
    "cross-entropy-backend-needs-torch-native-loss": (
        TE_ABSENT,
        _set(**{CE: "torch", M + "cross_entropy_fusion_impl": "native"}),
        _set(**{CE: "torch"}),
    ),
    "triton-cross-entropy-needs-cuda": (
        TE_ABSENT,
        _set(**{CE: "triton", "dist.device": "cpu"}),
        _set(**{CE: "triton"}),
    ),
    "torch-native-wgrad-accumulation-known": (TE_ABSENT, _set(**{WA: "apex"}), _set(**{WA: "unfused"})),
    "fused-wgrad-accumulation-needs-cuda": (
        TE_ABSENT,
        _set(**{WA: "fused", "dist.device": "cpu"}),
        _set(**{WA: "fused"}),
    ),
    "fused-wgrad-accumulation-needs-fp32-main-grad": (
        TE_ABSENT,
        _set(**{WA: "fused", "ddp.grad_reduce_in_fp32": False}),
        _set(**{WA: "fused", "ddp.grad_reduce_in_fp32": True}),
    ),
}


def test_every_rule_has_cases():
    assert set(CASES) == {rule.id for rule in RULES}


def _violated_ids(cfg, facts):
    return violated_rule_ids(RULES, cfg, facts)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_negative_case_is_reported(rule_id):
    facts, breaks, _ = CASES[rule_id]
    assert rule_id in _violated_ids(breaks(qwen3_30b_a3b_pretrain_config()), facts)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_positive_case_passes(rule_id):
    facts, _, satisfies = CASES[rule_id]
    assert rule_id not in _violated_ids(satisfies(qwen3_30b_a3b_pretrain_config()), facts)


@pytest.mark.parametrize(
    "ep,blocks,refused",
    [
        (2, 2, False),
        (2, 32, False),
        (2, 64, False),
        (8, 8, False),
        (8, 16, False),
        (8, 64, False),
        (2, 6, True),  # a multiple of EP, but three blocks per peer do not divide a 64-byte row
        (8, 24, True),
        (8, 40, True),
        (4, 48, True),
        (8, 4, True),
        (2, 128, True),  # fewer blocks than ranks; more than torch launches
    ],
)
def test_nvshmem_blocks_must_split_every_peers_rows_exactly(ep, blocks, refused):
    cfg = _set(**{M + "expert_model_parallel_size": ep, M + "torch_native_nvshmem_blocks": blocks})(
        qwen3_30b_a3b_pretrain_config()
    )
    assert ("nvshmem-blocks-in-range" in _violated_ids(cfg, TE_ABSENT)) is refused


def test_validate_refuses_a_transport_that_would_have_no_effect():
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.model.expert_model_parallel_size = 1
    cfg.model.torch_native_ep_transport = "nccl"
    with pytest.raises(ConfigValidationError, match="ep-transport-needs-sorted-ep-dispatch"):
        cfg.validate()


@pytest.mark.parametrize(
    "facts,changes,refused",
    [
        (HOPPER, {GG: "grouped_mm", **BF16}, False),
        (HOPPER, {GG: "grouped_mm_padded", **BF16}, False),
        (dict(te_version=None, device_capability=None), {GG: "grouped_mm", **BF16}, False),  # unknown GPU
        (HOPPER, {GG: "grouped_mm", M + "bf16": False}, True),  # fp32/fp16: no grouped_mm kernel
        (HOPPER, {GG: "grouped_mm", "dist.device": "cpu", **BF16}, True),
    ],
)
def test_grouped_mm_needs_bf16_on_a_capable_gpu(facts, changes, refused):
    cfg = _set(**changes)(qwen3_30b_a3b_pretrain_config())
    assert ("grouped-mm-needs-hopper-bf16" in _violated_ids(cfg, facts)) is refused


def test_validate_refuses_a_kernel_setting_that_would_have_no_effect():
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.model.layer_spec = "local"
    cfg.model.torch_native_grouped_gemm_backend = "loop"
    with pytest.raises(ConfigValidationError, match="torch-native-kernel-settings-need-torch-native-layers"):
        cfg.validate()


def test_the_defaults_pass_every_rule():
    assert _violated_ids(qwen3_30b_a3b_pretrain_config(), TE_ABSENT) == set()


@pytest.mark.parametrize(
    "changes,refused",
    [
        ({CS: "gather", EP: 1, M + "num_moe_experts": None}, True),  # a dense model: nothing to sort
        ({CS: "gather", EP: 1, M + "num_moe_experts": 8, NA: "megatron"}, False),  # EP=1, 8 experts: 8 chunks
        ({CS: "megatron", EP: 1, M + "num_moe_experts": None}, False),
    ],
)
def test_the_gather_is_refused_where_there_are_no_local_experts_to_reorder(changes, refused):
    violated = _violated_ids(_set(**changes)(qwen3_30b_a3b_pretrain_config()), TE_ABSENT)
    assert ("moe-chunk-sort-gather-needs-local-experts" in violated) == refused


@pytest.mark.parametrize(
    "overrides,code,says",
    [
        (["model.torch_native_dispatcher=sorted"], 2, "[moe-chunk-sort-gather-needs-megatron-dispatcher]"),
        (["model.moe_token_dispatcher_type=allgather"], 2, "[moe-chunk-sort-gather-needs-alltoall-dispatcher]"),
        ([], 0, ""),  # auto at EP=4 keeps megatron's dispatcher: 4 ranks x 2 local experts to sort
    ],
)
def test_the_harness_dry_run_refuses_a_gather_that_would_not_act(overrides, code, says, tmp_path):
    out = io.StringIO()
    argv = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "4", "-ep", "4", "--max_steps", "3"]
    got = main([*argv, "model.moe_chunk_sort=gather", *overrides, "--dryrun", "-l", str(tmp_path / "run")], out=out)
    text = out.getvalue()
    assert got == code and says in text, text[-3000:]
    if code:
        assert "nothing was launched" in text


@pytest.mark.parametrize(
    "changes, violated",
    [
        ({RCF: 2.0, EP: 16, NA: "megatron"}, {"rank-capacity-factor-needs-sorted-ep-dispatch"}),
        ({RCF: 2.0, EP: 1, NA: "sorted"}, {"rank-capacity-factor-needs-sorted-ep-dispatch"}),  # nothing exchanged
        (
            {RCF: 0.5, EP: 1, NA: "sorted"},
            {"rank-capacity-factor-at-least-one", "rank-capacity-factor-needs-sorted-ep-dispatch"},
        ),
        ({RCF: "two", **SORTED_EP16}, {"rank-capacity-factor-at-least-one"}),
        ({RCF: 1.5, **SORTED_EP16}, set()),
    ],
)
def test_a_budget_is_refused_where_it_could_not_act_or_always_overflows(changes, violated):
    ids = _violated_ids(_set(**changes)(qwen3_30b_a3b_pretrain_config()), TE_ABSENT)
    assert {i for i in ids if i.startswith("rank-capacity-factor")} == violated


@pytest.mark.parametrize(
    "factor, code, says",
    [
        ("0.9", 2, "[rank-capacity-factor-at-least-one]"),
        ("1.5", 0, ""),
    ],
)
def test_the_harness_dry_run_checks_the_budget(factor, code, says, tmp_path):
    out = io.StringIO()
    argv = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "4", "-ep", "4", "--max_steps", "3"]
    sorted_ep = ["model.torch_native_dispatcher=sorted", f"model.torch_native_rank_capacity_factor={factor}"]
    got = main([*argv, *sorted_ep, "--dryrun", "-l", str(tmp_path / "run")], out=out)
    text = out.getvalue()
    assert got == code and says in text, text[-3000:]
