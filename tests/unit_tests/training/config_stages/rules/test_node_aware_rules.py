"""The node-aware dispatcher's prerequisites, refused before launch: through ``cfg.validate()`` and the
harness's ``--dryrun`` (each case of the rule table itself is in ``test_torch_native_rules.py``), and
where the harness takes ``model.torch_native_gpus_per_node`` from (``-gn``)."""

from __future__ import annotations

import io

import pytest

from megatron.bridge.perf.harness.argument_parser import parse_args
from megatron.bridge.perf.harness.config_builder import build_config
from megatron.bridge.perf.harness.run import main
from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config
from megatron.bridge.training.errors import ConfigValidationError

NODE_AWARE = ["model.layer_spec=torch_native", "model.torch_native_dispatcher=node_aware"]
TINY_CPU_EP4 = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "4", "-ep", "4", "--max_steps", "3"]
H100_EP16 = ["-mr", "qwen3_30b_a3b", "-g", "h100", "-ng", "16", "-ep", "16", "--max_steps", "3"]


NA = {"torch_native_dispatcher": "node_aware"}
NA8 = {**NA, "torch_native_gpus_per_node": 8}


@pytest.mark.parametrize(
    "changes,rule,field,value",
    [
        (NA, "node-aware-dispatch-needs-gpus-per-node", "model.torch_native_gpus_per_node", None),
        (
            {**NA, "torch_native_gpus_per_node": 6},
            "gpus-per-node-divides-ep-size",
            "model.torch_native_gpus_per_node",
            6,
        ),
        (
            {**NA8, "expert_model_parallel_size": 1},
            "node-aware-dispatch-needs-ep",
            "model.expert_model_parallel_size",
            1,
        ),
        (
            {**NA8, "moe_expert_capacity_factor": 1.0},
            "node-aware-dispatch-must-be-exact",
            "model.moe_expert_capacity_factor",
            1.0,
        ),
        (
            {**NA8, "torch_native_nvshmem_blocks": 16},
            "node-aware-dispatch-takes-no-sorted-transport",
            "model.torch_native_nvshmem_blocks",
            16,
        ),
        (
            {"torch_native_gpus_per_node": 8},
            "gpus-per-node-needs-node-aware-dispatch",
            "model.torch_native_gpus_per_node",
            8,
        ),
    ],
)
def test_validate_refuses_what_the_node_aware_dispatcher_cannot_do(changes, rule, field, value) -> None:
    """A typed violation: the rule id, the field and its value, and the fix."""
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.model.layer_spec = "torch_native"
    for name, new in changes.items():
        setattr(cfg.model, name, new)
    with pytest.raises(ConfigValidationError) as caught:
        cfg.validate(world_size=16)
    violation = next(v for v in caught.value.violations if v.rule == rule)
    assert violation.values[violation.fields.index(field)] == value
    assert violation.fix and violation.message


def test_validate_accepts_ep16_over_two_nodes_of_eight() -> None:
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.model.layer_spec = "torch_native"
    cfg.model.torch_native_dispatcher = "node_aware"
    cfg.model.torch_native_gpus_per_node = 8
    cfg.validate(world_size=16)


def _dryrun(argv: list[str], tmp_path) -> tuple[int, str]:
    out = io.StringIO()
    code = main([*argv, "--dryrun", "-l", str(tmp_path / "run")], out=out)
    return code, out.getvalue()


@pytest.mark.parametrize(
    "argv,rule",
    [
        ([*TINY_CPU_EP4, "-gn", "3", *NODE_AWARE], "gpus-per-node-divides-ep-size"),
        ([*H100_EP16, "-gn", "6", *NODE_AWARE], "gpus-per-node-divides-ep-size"),
        (["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "4", "-ep", "1", *NODE_AWARE], "node-aware-dispatch-needs-ep"),
        (
            [*TINY_CPU_EP4, *NODE_AWARE, "model.torch_native_ep_transport=nccl"],
            "node-aware-dispatch-takes-no-sorted-transport",
        ),
        ([*TINY_CPU_EP4, "model.torch_native_gpus_per_node=2"], "gpus-per-node-needs-node-aware-dispatch"),
        (
            [*H100_EP16, "-gn", "8", *NODE_AWARE, "--cuda_graph_impl", "full_iteration"],
            "full-iteration-graph-sync-free-moe",
        ),
    ],
)
def test_the_harness_refuses_before_launch(argv, rule, tmp_path) -> None:
    code, text = _dryrun(argv, tmp_path)
    assert code == 2 and f"[{rule}]" in text and "nothing was launched" in text, text[-3000:]


@pytest.mark.parametrize(
    "argv,gpus_per_node,source",
    [
        ([*TINY_CPU_EP4, "-gn", "2", *NODE_AWARE], 2, "flag"),  # two "nodes" of two processes on this host
        ([*TINY_CPU_EP4, *NODE_AWARE], 4, "computed"),  # CPU mode: one host, one node, one stage
        ([*H100_EP16, "-gn", "8", *NODE_AWARE], 8, "flag"),
        ([*H100_EP16, *NODE_AWARE], 8, "computed"),  # -gn's default: at most 8 a node
        ([*H100_EP16, *NODE_AWARE, "model.torch_native_gpus_per_node=4"], 4, "cli"),  # given: kept
        ([*TINY_CPU_EP4], None, None),  # another dispatcher: left unset
    ],
)
def test_the_harness_sets_gpus_per_node_from_gn_for_the_node_aware_dispatcher(
    argv, gpus_per_node, source, tmp_path
) -> None:
    built = build_config(parse_args([*argv, "-l", str(tmp_path / "run")]))
    assert built.cfg.model.torch_native_gpus_per_node == gpus_per_node
    assert built.cfg.provenance.get("model.torch_native_gpus_per_node") == source


def test_the_harness_accepts_ep16_over_two_nodes_of_eight(tmp_path) -> None:
    code, text = _dryrun([*H100_EP16, "-gn", "8", *NODE_AWARE], tmp_path)
    assert code == 0, text[-3000:]
