"""The harness's arguments as one typed record, built once from what ``argument_parser`` parsed.

Planning and config building take a :class:`HarnessArgs`, so every flag they read has a name and a
type a checker and a reader can follow (an ``argparse.Namespace`` answers any attribute with
anything). Each field is one flag's destination (``--time`` is ``time_limit``); ``argv`` is the
command line as given, which a sweep's ``sweep.md`` repeats. "Not given" is ``None``, as the parser
leaves it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Optional, Sequence


@dataclass(frozen=True, kw_only=True)
class HarnessArgs:
    """One harness command line, parsed and checked (``argument_parser.parse_args``)."""

    # recipe and machine
    model_family_name: str
    model_recipe_name: str
    task: str
    gpu: Optional[str]
    compute_dtype: Optional[str]
    num_gpus: Optional[int]
    gpus_per_node: Optional[int]
    procs_per_gpu: int
    # training and model: each flag sets one config field (``flag_fields.FLAG_FIELDS``)
    max_steps: Optional[int]
    cuda_graph_impl: Optional[str]
    moe_flex_dispatcher_backend: Optional[str]
    moe_a2a_overlap: Optional[bool]
    tokenizer_type: Optional[str]
    tensor_model_parallel_size: Optional[int]
    pipeline_model_parallel_size: Optional[int]
    virtual_pipeline_model_parallel_size: Optional[int]
    context_parallel_size: Optional[int]
    expert_model_parallel_size: Optional[int]
    expert_tensor_parallel_size: Optional[int]
    global_batch_size: Optional[int]
    micro_batch_size: Optional[int]
    seq_length: Optional[int]
    # inputs, outputs and modes
    config_file: Optional[str]
    dryrun: bool
    save_config_filepath: Optional[str]
    log_dir: Optional[str]
    steady_state_window: Optional[list[int]]
    sweep: Optional[str]
    sweep_repeats: int
    verbose: bool
    # emulated world
    emulate: bool
    network: Optional[str]
    emulate_rank: Optional[int]
    # profiling
    profile: bool
    profile_step_start: Optional[int]
    profile_step_end: Optional[int]
    profile_ranks: Optional[list[int]]
    # SLURM
    account: Optional[str]
    partition: Optional[str]
    time_limit: Optional[str]
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
