"""The harness's arguments as one typed record, built once from what ``argument_parser`` parsed.

Planning and config building take a :class:`HarnessArgs`, so every flag they read has a name and a
type a checker and a reader can follow (an ``argparse.Namespace`` answers any attribute with
anything). Each field is one flag's destination (``--time`` is ``time_limit``); ``argv`` is the
command line as given, which a sweep's ``sweep.md`` repeats. "Not given" is ``None``, as the parser
leaves it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields


@dataclass(frozen=True, kw_only=True)
class HarnessArgs:
    """One harness command line, parsed and checked (``argument_parser.parse_args``)."""

    # recipe and machine
    model_family_name: str
    model_recipe_name: str
    task: str
    gpu: str | None
    compute_dtype: str | None
    num_gpus: int | None
    gpus_per_node: int | None
    procs_per_gpu: int
    # training and model: each flag sets one config field (``flag_fields.FLAG_FIELDS``)
    max_steps: int | None
    cuda_graph_impl: str | None
    moe_flex_dispatcher_backend: str | None
    moe_a2a_overlap: bool | None
    tokenizer_type: str | None
    tensor_model_parallel_size: int | None
    pipeline_model_parallel_size: int | None
    virtual_pipeline_model_parallel_size: int | None
    context_parallel_size: int | None
    expert_model_parallel_size: int | None
    expert_tensor_parallel_size: int | None
    global_batch_size: int | None
    micro_batch_size: int | None
    seq_length: int | None
    # inputs, outputs and modes
    config_file: str | None
    dryrun: bool
    save_config_filepath: str | None
    log_dir: str | None
    steady_state_window: list[int] | None
    sweep: str | None
    sweep_repeats: int
    verbose: bool
    # emulated world
    emulate: bool
    network: str | None
    emulate_rank: int | None
    # profiling
    profile: bool
    profile_step_start: int | None
    profile_step_end: int | None
    profile_ranks: list[int] | None
    # SLURM
    account: str | None
    partition: str | None
    time_limit: str | None
    # dotted overrides, applied last, and the command line they came from
    overrides: list[str]
    argv: list[str]

    @classmethod
    def from_namespace(cls, parsed: argparse.Namespace, argv: Sequence[str]) -> HarnessArgs:
        """The record of ``parsed`` (every flag's destination a field). A flag without a field, or a
        field without a flag, is a mistake in this module, said here rather than as a missing attribute
        later."""
        given = vars(parsed)
        expected = {f.name for f in fields(cls)} - {"argv"}
        if set(given) != expected:
            raise TypeError(f"the parser's destinations and HarnessArgs' fields differ: flags without a field "
                            f"{sorted(set(given) - expected)}, fields without a flag {sorted(expected - set(given))}")
        return cls(argv=list(argv), **given)
