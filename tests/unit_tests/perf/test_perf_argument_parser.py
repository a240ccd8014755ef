"""Every harness flag parses to the right value; bad values are usage errors (exit 2)."""

import pytest

from megatron.bridge.perf.harness.argument_parser import PLAIN_ALLTOALL, build_parser, parse_args, str_to_bool
from megatron.bridge.perf.harness.config_builder import flag_values
from megatron.bridge.perf.harness.harness_args import FLAG_FIELDS

BASE = ["-mr", "qwen3_30b_a3b"]


@pytest.mark.parametrize(
    "flags, dest, expected",
    [
        (["-m", "qwen"], "model_family_name", "qwen"),
        (["--model_family_name", "qwen"], "model_family_name", "qwen"),
        (["--task", "pretrain"], "task", "pretrain"),
        (["--task", "PRETRAIN"], "task", "pretrain"),
        (["-g", "h100"], "gpu", "h100"),
        (["--gpu", "GB200"], "gpu", "gb200"),
        (["-g", "cpu"], "gpu", "cpu"),
        (["-c", "bf16"], "compute_dtype", "bf16"),
        (["-c", "fp8_cs"], "compute_dtype", "fp8_cs"),
        (["--compute_dtype", "fp8_mx"], "compute_dtype", "fp8_mx"),
        (["-ng", "16"], "num_gpus", 16),
        (["-gn", "8"], "gpus_per_node", 8),
        (["--procs_per_gpu", "2"], "procs_per_gpu", 2),
        (["--max_steps", "8"], "max_steps", 8),
        (["--cuda_graph_impl", "none"], "cuda_graph_impl", "none"),
        (["--cuda_graph_impl", "transformer_engine"], "cuda_graph_impl", "transformer_engine"),
        (["--moe_flex_dispatcher_backend", "None"], "moe_flex_dispatcher_backend", PLAIN_ALLTOALL),
        (["--moe_flex_dispatcher_backend", "none"], "moe_flex_dispatcher_backend", PLAIN_ALLTOALL),
        (["--moe_flex_dispatcher_backend", "deepep"], "moe_flex_dispatcher_backend", "deepep"),
        (["--moe_flex_dispatcher_backend", "HybridEP"], "moe_flex_dispatcher_backend", "hybridep"),
        (["--moe_a2a_overlap", "false"], "moe_a2a_overlap", False),
        (["--moe_a2a_overlap", "TRUE"], "moe_a2a_overlap", True),
        (["--tokenizer_type", "NullTokenizer"], "tokenizer_type", "NullTokenizer"),
        (["-tp", "2"], "tensor_model_parallel_size", 2),
        (["-pp", "2"], "pipeline_model_parallel_size", 2),
        (["-vp", "4"], "virtual_pipeline_model_parallel_size", 4),
        (["-cp", "2"], "context_parallel_size", 2),
        (["-ep", "8"], "expert_model_parallel_size", 8),
        (["-et", "1"], "expert_tensor_parallel_size", 1),
        (["-gb", "512"], "global_batch_size", 512),
        (["-mb", "2"], "micro_batch_size", 2),
        (["-sl", "2048"], "seq_length", 2048),
        (["--config_file", "x.yaml"], "config_file", "x.yaml"),
        (["--dryrun"], "dryrun", True),
        (["--save_config_filepath", "out.yaml"], "save_config_filepath", "out.yaml"),
        (["-l", "runs/x"], "log_dir", "runs/x"),
        (["--log_dir", "runs/y"], "log_dir", "runs/y"),
        (["--steady_state_window", "2,5"], "steady_state_window", [2, 5]),
        (
            ["--sweep", "comm_overlap.overlap_moe_expert_parallel_comm=false,true"],
            "sweep",
            "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
        ),
        (["--profile"], "profile", True),
        (["--profile_step_start", "4"], "profile_step_start", 4),
        (["--profile_step_end", "5"], "profile_step_end", 5),
        (["--profile_ranks", "0,1"], "profile_ranks", [0, 1]),
        (["--account", "acct"], "account", "acct"),
        (["--partition", "batch"], "partition", "batch"),
        (["--time", "00:30:00"], "time_limit", "00:30:00"),
    ],
)
def test_each_flag(flags, dest, expected):
    assert getattr(parse_args(BASE + flags), dest) == expected


def test_not_given_is_none():
    args = parse_args(BASE)
    for dest in (
        "gpu",
        "compute_dtype",
        "num_gpus",
        "max_steps",
        "moe_flex_dispatcher_backend",
        "moe_a2a_overlap",
        "tokenizer_type",
        "expert_model_parallel_size",
        "global_batch_size",
        "config_file",
        "log_dir",
        "sweep",
        "profile_ranks",
    ):
        assert getattr(args, dest) is None, dest
    assert args.overrides == [] and args.dryrun is False


@pytest.mark.parametrize(
    "text, value",
    [(t, True) for t in ("true", "True", "1", "yes", "YES")]
    + [(f, False) for f in ("false", "FALSE", "0", "no", "No")],
)
def test_bool_words(text, value):
    assert str_to_bool(text) is value


@pytest.mark.parametrize(
    "flags",
    [
        ["--moe_a2a_overlap", "maybe"],
        ["--moe_a2a_overlap", "2"],
        ["--moe_a2a_overlap", ""],
        ["--moe_flex_dispatcher_backend", "nccl"],
        ["-g", "v100"],
        ["-c", "int4"],
        ["--task", "inference"],
        ["--cuda_graph_impl", "full"],
        ["--tokenizer_type", "GPT2BPETokenizer"],
        ["-ng", "0"],
        ["-ng", "two"],
        ["-ep", "-1"],
        ["-tp", "1.5"],
        ["--max_steps", "0"],
        ["--profile_ranks", "a,b"],
        ["--steady_state_window", "8,3"],
        ["--steady_state_window", "3"],
        ["--profile_step_start", "6", "--profile_step_end", "5"],
        ["--sweep", "noequals"],
        ["--sweep_repeats", "2"],
        ["--sweep", "model.bf16=true,false", "--sweep_repeats", "0"],
        ["not_an_override"],
        ["model=1"],
        ["-g", "cpu", "--procs_per_gpu", "2"],
    ],
)
def test_bad_values_exit_2(flags, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(BASE + flags)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_recipe_is_required(capsys):
    with pytest.raises(SystemExit):
        parse_args(["-m", "qwen"])


def test_overrides_anywhere_and_in_order():
    args = parse_args(["a.b=1", *BASE, "c.d=x", "--max_steps", "3", "e.f=[1,2]"])
    assert args.overrides == ["a.b=1", "c.d=x", "e.f=[1,2]"]
    assert args.max_steps == 3


def test_readme_command_parses(readme_argv):
    args = parse_args(readme_argv)
    assert (args.model_family_name, args.model_recipe_name, args.task, args.gpu) == (
        "qwen",
        "qwen3_30b_a3b",
        "pretrain",
        "h100",
    )
    assert (args.num_gpus, args.gpus_per_node, args.max_steps) == (16, 8, 8)
    assert args.moe_a2a_overlap is False and args.moe_flex_dispatcher_backend == PLAIN_ALLTOALL
    assert len(args.overrides) == 3


@pytest.mark.parametrize(
    "override",
    [
        "+tokenizer.hf_tokenizer_kwargs.use_fast=true",
        "++logger.log_interval=2",
        "~tokenizer.hf_tokenizer_kwargs.use_fast",
    ],
)
def test_hydra_override_forms_are_accepted(override):
    assert parse_args(["-mr", "qwen3_moe_tiny", override]).overrides == [override]


@pytest.mark.parametrize("dest, field", sorted(FLAG_FIELDS.items()))
def test_every_flag_of_the_one_table_sets_its_field(dest, field):
    """The flag-to-field table is written once: the parser offers each flag and the config builder
    puts what it was given into that field."""
    flag = next(a for a in build_parser()._actions if a.dest == dest)
    raw = {
        "moe_a2a_overlap": "true",
        "cuda_graph_impl": "none",
        "tokenizer_type": "NullTokenizer",
        "steady_state_window": "3,5",
        "profile_ranks": "0",
    }.get(dest, "2")
    args = parse_args(["-m", "qwen", "-mr", "qwen3_30b_a3b", flag.option_strings[-1], raw])
    assert flag_values(args)[field] == getattr(args, dest)
