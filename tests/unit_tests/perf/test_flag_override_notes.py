"""A flag and a dotted override that set the same field: the harness says so, once, naming both and
which one the run gets (dotted overrides come after flags), through its real entry point (a dry run)."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from megatron.bridge.perf.harness.argument_parser import parse_args
from megatron.bridge.perf.harness.config_builder import emulation_values, flag_values
from megatron.bridge.perf.harness.harness_args import flag_of_field
from megatron.bridge.perf.harness.run import main

TINY_CPU = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--dryrun"]
BOTH_SET = "both set"


def dry_run(argv: list[str]) -> str:
    out = io.StringIO()
    code = main(argv, out=out)
    text = out.getvalue()
    assert code == 0, text
    return text


def notes(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if BOTH_SET in line]


def test_the_readmes_command_says_its_dotted_override_beats_its_flag(readme_command):
    """The README's own command gives ``--moe_a2a_overlap false`` and the dotted key set to true."""
    said = notes(dry_run([*readme_command, "--dryrun"]))
    assert said == [
        "note: --moe_a2a_overlap false and comm_overlap.overlap_moe_expert_parallel_comm=true both set "
        "comm_overlap.overlap_moe_expert_parallel_comm: the run gets true, from the dotted override (precedence: "
        "recipe < --config_file < flags < dotted overrides)"
    ], said


@pytest.mark.parametrize(
    "given, flag, override, key, value",
    [
        (["--max_steps", "5", "train.train_iters=7"], "--max_steps 5", "train.train_iters=7", "train.train_iters", "7"),
        (
            ["--max_steps", "5", "++train.train_iters=7"],
            "--max_steps 5",
            "++train.train_iters=7",
            "train.train_iters",
            "7",
        ),
        (
            ["model.expert_model_parallel_size=2"],
            "-ep/--expert_model_parallel_size 2",
            "model.expert_model_parallel_size=2",
            "model.expert_model_parallel_size",
            "2",
        ),
        (["dist.device=cpu"], "-g/--gpu cpu", "dist.device=cpu", "dist.device", "cpu"),
        (
            ["--moe_flex_dispatcher_backend", "None", "model.moe_token_dispatcher_type=allgather"],
            "--moe_flex_dispatcher_backend alltoall",
            "model.moe_token_dispatcher_type=allgather",
            "model.moe_token_dispatcher_type",
            "allgather",
        ),
        (
            ["--profile", "profiling.use_pytorch_profiler=false"],
            "--profile",
            "profiling.use_pytorch_profiler=false",
            "profiling.use_pytorch_profiler",
            "false",
        ),
    ],
    ids=["alias-flag", "hydra-force-form", "short-flag", "flag-of-another-name", "flag-of-several-fields", "switch"],
)
def test_a_field_set_by_a_flag_and_a_dotted_override_gets_one_note(tmp_path, given, flag, override, key, value):
    said = notes(dry_run([*TINY_CPU, "-l", str(tmp_path / "run"), *given]))
    assert len(said) == 1, said
    assert said[0].startswith(
        f"note: {flag} and {override} both set {key}: the run gets {value}, from the dotted override"
    ), said


def test_a_flag_applied_after_the_overrides_is_named_as_the_one_that_wins(tmp_path):
    """``--emulate`` makes the emulated world the ``-ng`` layout after the dotted overrides."""
    said = notes(dry_run([*TINY_CPU, "-l", str(tmp_path / "run"), "--emulate", "emulation.world_size=4"]))
    assert said == [
        "note: --emulate and emulation.world_size=4 both set emulation.world_size: the run gets 2, from "
        "--emulate, which is applied after the dotted overrides"
    ], said


def test_overrides_of_fields_no_flag_set_get_no_note(tmp_path):
    said = notes(
        dry_run(
            [
                *TINY_CPU,
                "-l",
                str(tmp_path / "run"),
                "--max_steps",
                "5",
                "train.eval_iters=2",
                "comm_overlap.overlap_moe_expert_parallel_comm=true",
            ]
        )
    )
    assert said == []


def test_a_swept_key_a_flag_also_sets_names_the_flag(tmp_path):
    out = dry_run(
        [
            *TINY_CPU,
            "-l",
            str(tmp_path / "sweep"),
            "--moe_a2a_overlap",
            "false",
            "--sweep",
            "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
        ]
    )
    assert out.count("note: the swept values replace --moe_a2a_overlap false") == 1, out
    assert notes(out) == []


def test_every_field_a_flag_sets_is_attributed_to_its_flag():
    """The notes name the flag of each field a flag sets: no flag writes a field the table misses."""
    args = parse_args(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "h100",
            "-c",
            "bf16",
            "--max_steps",
            "3",
            "--cuda_graph_impl",
            "none",
            "--moe_flex_dispatcher_backend",
            "deepep",
            "--moe_a2a_overlap",
            "true",
            "--tokenizer_type",
            "NullTokenizer",
            "-tp",
            "1",
            "-pp",
            "1",
            "-vp",
            "2",
            "-cp",
            "1",
            "-ep",
            "2",
            "-et",
            "1",
            "-gb",
            "8",
            "-mb",
            "1",
            "-sl",
            "64",
            "-l",
            "runs/x",
            "--steady_state_window",
            "2,3",
            "--profile",
            "--profile_step_start",
            "2",
            "--profile_step_end",
            "3",
            "--profile_ranks",
            "0",
            "--emulate",
            "--network",
            "free",
            "--emulate_rank",
            "1",
            "-gn",
            "8",
        ]
    )
    written = {**flag_values(args), **emulation_values(args, 16), **flag_values(replace(args, gpu="cpu"))}
    assert {key: flag_of_field(key) for key in written if flag_of_field(key) is None} == {}
