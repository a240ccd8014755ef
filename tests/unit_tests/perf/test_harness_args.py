"""The harness's arguments are one typed record (``perf/harness/harness_args.py``), built once by
``parse_args`` and read by planning and config building."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from megatron.bridge.perf.harness.argument_parser import build_parser, parse_args
from megatron.bridge.perf.harness.harness_args import HarnessArgs

TINY = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2"]


def _parser_destinations() -> set[str]:
    return {action.dest for action in build_parser()._actions if action.dest != "help"}


def test_parse_args_gives_the_record_with_every_flag_as_a_field():
    args = parse_args([*TINY, "--moe_a2a_overlap", "false", "--time", "00:10:00", "train.train_iters=3"])
    assert isinstance(args, HarnessArgs)
    assert {f.name for f in dataclasses.fields(HarnessArgs)} == _parser_destinations() | {"argv"}
    assert (args.num_gpus, args.moe_a2a_overlap, args.time_limit, args.overrides) == (
        2,
        False,
        "00:10:00",
        ["train.train_iters=3"],
    )


def test_the_record_keeps_the_command_line_as_given():
    argv = [*TINY, "model.num_layers=2", "--dryrun"]
    assert parse_args(argv).argv == argv


def test_the_record_is_built_once_and_not_changed_after():
    args = parse_args(TINY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.gpu = "h100"  # type: ignore[misc]
    assert dataclasses.replace(args, gpu="h100").gpu == "h100" and args.gpu == "cpu"


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda ns: setattr(ns, "new_flag", 1), "flags without a field ['new_flag']"),
        (lambda ns: delattr(ns, "account"), "fields without a flag ['account']"),
    ],
    ids=["flag-without-field", "field-without-flag"],
)
def test_a_flag_and_the_record_out_of_step_is_said_by_name(change, named):
    parsed = build_parser().parse_args(TINY)
    change(parsed)
    with pytest.raises(TypeError, match=named.replace("[", r"\[").replace("]", r"\]")):
        HarnessArgs.from_namespace(parsed, TINY)


def test_the_parser_namespace_is_not_what_planning_gets():
    """An ``argparse.Namespace`` answers any attribute assignment; the record refuses an unknown one."""
    args = parse_args(TINY)
    assert not isinstance(args, argparse.Namespace)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.ended_jobs = []  # type: ignore[attr-defined]
