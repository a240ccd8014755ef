"""Config building: precedence recipe < --config_file < flags < dotted overrides, flag mappings."""

import pytest
import yaml

from megatron.bridge.perf.harness.argument_parser import parse_args
from megatron.bridge.perf.harness.config_builder import HarnessError, build_config, resolve
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.errors import CommOverlapConfigError, ConfigError, OverrideError

TINY = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "1"]


def build(tmp_path, *argv, yaml_data=None):
    extra = []
    if yaml_data is not None:
        path = tmp_path / "over.yaml"
        path.write_text(yaml.safe_dump(yaml_data))
        extra = ["--config_file", str(path)]
    return build_config(parse_args([*TINY, "-l", str(tmp_path / "run"), *extra, *argv]))


YAML = {"train": {"train_iters": 5, "micro_batch_size": 2}, "model": {"seq_length": 64, "num_layers": 4}}


@pytest.mark.parametrize(
    "with_yaml, argv, key, value, source",
    [
        (False, (), "train.train_iters", 10, None),  # recipe
        (True, (), "train.train_iters", 5, "yaml"),  # yaml over recipe
        (True, ("--max_steps", "7"), "train.train_iters", 7, "flag"),  # flag over yaml
        (True, ("--max_steps", "7", "train.train_iters=9"), "train.train_iters", 9, "cli"),  # cli over flag
        (True, ("train.train_iters=9", "--max_steps", "7"), "train.train_iters", 9, "cli"),  # position-free
        (True, ("-sl", "32"), "model.seq_length", 32, "flag"),
        (True, (), "model.seq_length", 64, "yaml"),
        (True, (), "model.num_layers", 4, "yaml"),
        (True, ("model.num_layers=3",), "model.num_layers", 3, "cli"),
        (True, ("-mb", "1"), "train.micro_batch_size", 1, "flag"),
        (False, ("-gb", "32", "train.global_batch_size=64"), "train.global_batch_size", 64, "cli"),
    ],
)
def test_precedence(tmp_path, with_yaml, argv, key, value, source):
    built = build(tmp_path, *argv, yaml_data=YAML if with_yaml else None)
    assert read_field(built.cfg, key) == value
    assert built.cfg.provenance.get(key) == source


@pytest.mark.parametrize(
    "flags, key, value",
    [
        (["-tp", "1"], "model.tensor_model_parallel_size", 1),
        (["-pp", "1"], "model.pipeline_model_parallel_size", 1),
        (["-vp", "2"], "model.virtual_pipeline_model_parallel_size", 2),
        (["-cp", "1"], "model.context_parallel_size", 1),
        (["-ep", "1"], "model.expert_model_parallel_size", 1),
        (["-et", "1"], "model.expert_tensor_parallel_size", 1),
        (["-gb", "16"], "train.global_batch_size", 16),
        (["-mb", "2"], "train.micro_batch_size", 2),
        (["-sl", "64"], "model.seq_length", 64),
        (["--max_steps", "3"], "train.train_iters", 3),
        (["-c", "fp16"], "mixed_precision", "fp16_mixed"),
        (["-c", "fp8"], "mixed_precision", "bf16_with_fp8_current_scaling_mixed"),
        (["--cuda_graph_impl", "local"], "model.cuda_graph_impl", "local"),
        (["--tokenizer_type", "HuggingFaceTokenizer"], "tokenizer.tokenizer_type", "HuggingFaceTokenizer"),
        (["--steady_state_window", "2,4"], "logger.steady_state_window", [2, 4]),
        (["--profile"], "profiling.use_pytorch_profiler", True),
        (["--profile_step_start", "3"], "profiling.profile_step_start", 3),
        (["--profile_step_end", "4"], "profiling.profile_step_end", 4),
        (["--profile_ranks", "0,1"], "profiling.profile_ranks", [0, 1]),
        ([], "dist.device", "cpu"),
        (["--moe_a2a_overlap", "false"], "comm_overlap.overlap_moe_expert_parallel_comm", False),
    ],
)
def test_flag_maps_to_field(tmp_path, flags, key, value):
    built = build(tmp_path, *flags)
    assert read_field(built.cfg, key) == value
    assert built.cfg.provenance[key] == "flag"


@pytest.mark.parametrize(
    "yaml_data, flag, ep, dw",
    [
        (None, "true", True, None),  # the recipe leaves delayed wgrad unset (off unless requested)
        (None, "false", False, None),
        (
            {"comm_overlap": {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}},
            "false",
            False,
            True,
        ),
        ({"comm_overlap": {"delay_wgrad_compute": True}}, "true", True, True),
    ],
)
def test_moe_a2a_overlap_flag_is_an_alias_of_one_field(tmp_path, yaml_data, flag, ep, dw):
    """``--moe_a2a_overlap`` sets the EP-overlap switch and nothing else (delayed wgrad keeps its value)."""
    built = build(tmp_path, "--moe_a2a_overlap", flag, yaml_data=yaml_data)
    co = built.cfg.comm_overlap
    assert (co.overlap_moe_expert_parallel_comm, co.delay_wgrad_compute) == (ep, dw)
    assert built.cfg.provenance["comm_overlap.overlap_moe_expert_parallel_comm"] == "flag"
    assert built.cfg.provenance.get("comm_overlap.delay_wgrad_compute") in (None, "yaml")


def test_moe_a2a_overlap_false_really_off_after_resolve(tmp_path):
    built = build(
        tmp_path,
        "--moe_a2a_overlap",
        "false",
        "-ep",
        "1",
        yaml_data={"comm_overlap": {"overlap_moe_expert_parallel_comm": True}},
    )
    resolved = resolve(built)
    assert resolved.model.overlap_moe_expert_parallel_comm is False
    assert resolved.model.delay_wgrad_compute is False and resolved.ddp.delay_wgrad_compute is False


def test_moe_a2a_overlap_false_does_not_clear_delayed_wgrad_silently(tmp_path):
    """Delayed wgrad on and the flag turning EP overlap off: refused, with both ways out."""
    built = build(
        tmp_path,
        "--moe_a2a_overlap",
        "false",
        "-ep",
        "1",
        yaml_data={"comm_overlap": {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}},
    )
    with pytest.raises(CommOverlapConfigError) as info:
        resolve(built)
    (violation,) = info.value.violations
    assert violation.rule == "delay-wgrad-needs-ep-overlap"
    assert "comm_overlap.delay_wgrad_compute=false" in violation.fix and "--moe_a2a_overlap" in violation.fix


@pytest.mark.parametrize(
    "backend, gpu, dispatcher, value",
    [
        ("None", "h100", "alltoall", None),
        ("deepep", "h100", "flex", "deepep"),
        ("hybridep", "gb200", "flex", "hybridep"),
    ],
)
def test_flex_backend_flag(tmp_path, backend, gpu, dispatcher, value):
    argv = [
        "-mr",
        "qwen3_30b_a3b",
        "-g",
        gpu,
        "-ng",
        "16",
        "-l",
        str(tmp_path),
        "--moe_flex_dispatcher_backend",
        backend,
    ]
    built = build_config(parse_args(argv))
    m = built.cfg.model
    assert (m.moe_token_dispatcher_type, m.moe_flex_dispatcher_backend, m.moe_shared_expert_overlap) == (
        dispatcher,
        value,
        False,
    )
    assert built.cfg.provenance["model.moe_token_dispatcher_type"] == "flag"
    assert built.cfg.provenance["model.moe_flex_dispatcher_backend"] == "flag"


def test_flex_backend_refused_on_unsupported_gpu(tmp_path):
    argv = [
        "-mr",
        "qwen3_30b_a3b",
        "-g",
        "gb200",
        "-ng",
        "16",
        "-l",
        str(tmp_path),
        "--moe_flex_dispatcher_backend",
        "deepep",
    ]
    with pytest.raises(ConfigError, match="GB200") as info:
        resolve(build_config(parse_args(argv)))
    rules = [v.rule for v in info.value.violations]
    # on a GPU machine without deep_ep the missing package is reported too
    assert rules[0] == "flex-backend-supported-on-gpu" and set(rules) <= {rules[0], "flex-needs-deep-ep"}


def test_cli_override_beats_flex_flag(tmp_path):
    argv = [
        "-mr",
        "qwen3_30b_a3b",
        "-g",
        "h100",
        "-ng",
        "16",
        "-l",
        str(tmp_path),
        "--moe_flex_dispatcher_backend",
        "deepep",
        "model.moe_token_dispatcher_type=alltoall",
    ]
    built = build_config(parse_args(argv))
    assert built.cfg.model.moe_token_dispatcher_type == "alltoall"
    assert built.cfg.provenance["model.moe_token_dispatcher_type"] == "cli"


def test_bad_override_is_typed_error(tmp_path):
    with pytest.raises(OverrideError, match="model.num_layers"):
        build(tmp_path, "model.num_layers=abc")


def test_unknown_recipe_is_harness_error(tmp_path):
    with pytest.raises(HarnessError, match="Available recipes"):
        build_config(parse_args(["-mr", "nope", "-g", "cpu"]))


def test_layout_not_dividing_gpus_names_fitting_counts(tmp_path):
    with pytest.raises(HarnessError, match="GPU counts that fit: 16, 32"):
        build_config(parse_args(["-mr", "qwen3_30b_a3b", "-g", "h100", "-ng", "24", "-l", str(tmp_path)]))


def test_computed_values(tmp_path):
    built = build_config(parse_args(["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2"]))
    assert built.cfg.train.global_batch_size == 16
    assert built.cfg.provenance["train.global_batch_size"] == "computed"
    assert built.cfg.provenance["logger.log_dir"] == "computed"
    assert "runs/qwen3_moe_tiny_pretrain_" in built.cfg.logger.log_dir
    assert any("global batch scaled" in n for n in built.notes)


def test_ranks_sharing_a_gpu_get_gloo(tmp_path):
    built = build_config(
        parse_args(
            ["-mr", "qwen3_moe_tiny", "-g", "h200", "-ng", "1", "--procs_per_gpu", "2", "-ep", "2", "-l", str(tmp_path)]
        )
    )
    assert built.world_size == 2 and built.cfg.dist.distributed_backend == "gloo"
    assert built.cfg.provenance["dist.distributed_backend"] == "computed"
    resolve(built)


def test_ranks_sharing_a_gpu_refuse_nccl(tmp_path):
    with pytest.raises(HarnessError, match="NCCL"):
        build_config(
            parse_args(
                [
                    "-mr",
                    "qwen3_moe_tiny",
                    "-g",
                    "h200",
                    "-ng",
                    "1",
                    "--procs_per_gpu",
                    "2",
                    "dist.distributed_backend=nccl",
                    "-l",
                    str(tmp_path),
                ]
            )
        )


@pytest.mark.host("h100", transformer_engine=None)
def test_fp8_without_te_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError) as exc:
        resolve(build(tmp_path, "-c", "fp8"))
    assert "fp8-needs-transformer-engine" in str(exc.value)
