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
from dataclasses import Field, dataclass, field, fields
from typing import Any

PRECEDENCE = "recipe < --config_file < flags < dotted overrides"


def _sets(key: str) -> Any:
    """A flag that is an alias of exactly one config field, the dotted ``key``."""
    return field(metadata={"sets": key})


def _may_set(*keys: str) -> Any:
    """A flag that may set the fields ``keys`` (``config_builder.flag_values`` and ``emulation_values`` say when)."""
    return field(metadata={"may_set": keys})


@dataclass(frozen=True, kw_only=True)
class HarnessArgs:
    """One harness command line, parsed and checked (``argument_parser.parse_args``)."""

    # recipe and machine
    model_family_name: str
    model_recipe_name: str
    task: str
    gpu: str | None = _may_set("dist.device", "dist.target_gpu")
    compute_dtype: str | None = _may_set("mixed_precision")
    num_gpus: int | None
    gpus_per_node: int | None = _may_set("emulation.gpus_per_node")
    procs_per_gpu: int
    # flags that are aliases of one config field, named in their metadata (FLAG_FIELDS below, in this order)
    tensor_model_parallel_size: int | None = _sets("model.tensor_model_parallel_size")
    pipeline_model_parallel_size: int | None = _sets("model.pipeline_model_parallel_size")
    virtual_pipeline_model_parallel_size: int | None = _sets("model.virtual_pipeline_model_parallel_size")
    context_parallel_size: int | None = _sets("model.context_parallel_size")
    expert_model_parallel_size: int | None = _sets("model.expert_model_parallel_size")
    expert_tensor_parallel_size: int | None = _sets("model.expert_tensor_parallel_size")
    global_batch_size: int | None = _sets("train.global_batch_size")
    micro_batch_size: int | None = _sets("train.micro_batch_size")
    seq_length: int | None = _sets("model.seq_length")
    max_steps: int | None = _sets("train.train_iters")
    cuda_graph_impl: str | None = _sets("model.cuda_graph_impl")
    tokenizer_type: str | None = _sets("tokenizer.tokenizer_type")
    steady_state_window: list[int] | None = _sets("logger.steady_state_window")
    profile_step_start: int | None = _sets("profiling.profile_step_start")
    profile_step_end: int | None = _sets("profiling.profile_step_end")
    profile_ranks: list[int] | None = _sets("profiling.profile_ranks")
    moe_a2a_overlap: bool | None = _sets("comm_overlap.overlap_moe_expert_parallel_comm")
    moe_flex_dispatcher_backend: str | None = _may_set(
        "model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend", "model.moe_shared_expert_overlap"
    )
    # inputs, outputs and modes
    config_file: str | None
    dryrun: bool
    save_config_filepath: str | None
    log_dir: str | None = _may_set("logger.log_dir")
    sweep: str | None
    sweep_repeats: int
    verbose: bool
    # emulated world
    emulate: bool = _may_set("emulation.world_size")
    network: str | None = _may_set("emulation.network")
    emulate_rank: int | None = _may_set("emulation.rank")
    # profiling
    profile: bool = _may_set("profiling.use_pytorch_profiler")
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
            raise TypeError(
                f"the parser's destinations and HarnessArgs' fields differ: flags without a field "
                f"{sorted(set(given) - expected)}, fields without a flag {sorted(expected - set(given))}"
            )
        return cls(argv=list(argv), **given)


def _declared(kind: str) -> dict[str, Any]:
    declared: tuple[Field[Any], ...] = fields(HarnessArgs)
    return {f.name: f.metadata[kind] for f in declared if kind in f.metadata}


FLAG_FIELDS: dict[str, str] = _declared("sets")
"""Flags that are aliases of exactly one config field (argparse dest -> dotted key): the parser's help
text and the config builder's values read it."""

OTHER_FLAG_FIELDS: dict[str, tuple[str, ...]] = _declared("may_set")
"""The other flags (argparse dest) -> the fields they may set: ``-g`` one of its two,
``--moe_flex_dispatcher_backend`` the dispatcher choice, ``--emulate`` the emulated world's size
(``-ng``), ``-gn`` its GPUs per node; ``-c`` names the precision recipe."""


def flag_of_field(key: str) -> str | None:
    """The flag (argparse dest) that sets the dotted ``key``, if one does, so that a note can name a
    flag and a dotted override that set the same field together."""
    for dest, field_key in FLAG_FIELDS.items():
        if field_key == key:
            return dest
    return next((dest for dest, keys in OTHER_FLAG_FIELDS.items() if key in keys), None)
