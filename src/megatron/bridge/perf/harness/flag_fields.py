"""Which config field each harness flag sets: the parser's help text and the config builder's values
read the aliases table, and ``flag_notes`` names a flag and a dotted override that set the same field
together, so that the run's value is never a silent choice."""

from __future__ import annotations

FLAG_FIELDS: dict[str, str] = {
    "tensor_model_parallel_size": "model.tensor_model_parallel_size",
    "pipeline_model_parallel_size": "model.pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size": "model.virtual_pipeline_model_parallel_size",
    "context_parallel_size": "model.context_parallel_size",
    "expert_model_parallel_size": "model.expert_model_parallel_size",
    "expert_tensor_parallel_size": "model.expert_tensor_parallel_size",
    "global_batch_size": "train.global_batch_size",
    "micro_batch_size": "train.micro_batch_size",
    "seq_length": "model.seq_length",
    "max_steps": "train.train_iters",
    "cuda_graph_impl": "model.cuda_graph_impl",
    "tokenizer_type": "tokenizer.tokenizer_type",
    "steady_state_window": "logger.steady_state_window",
    "profile_step_start": "profiling.profile_step_start",
    "profile_step_end": "profiling.profile_step_end",
    "profile_ranks": "profiling.profile_ranks",
    "moe_a2a_overlap": "comm_overlap.overlap_moe_expert_parallel_comm",
}
"""Flags that are aliases of exactly one config field (argparse dest -> dotted key). The other
flags: ``-c`` (``mixed_precision``, by name), ``-g`` (``dist.target_gpu``; ``cpu``: ``dist.device``),
``--moe_flex_dispatcher_backend`` (the dispatcher choice of ``dispatcher_fields``), ``--profile``,
``-l``."""


OTHER_FLAG_FIELDS: dict[str, tuple[str, ...]] = {
    "compute_dtype": ("mixed_precision",),
    "gpu": ("dist.device", "dist.target_gpu"),
    "moe_flex_dispatcher_backend": (
        "model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend", "model.moe_shared_expert_overlap",
    ),
    "profile": ("profiling.use_pytorch_profiler",),
    "log_dir": ("logger.log_dir",),
    "network": ("emulation.network",),
    "emulate_rank": ("emulation.rank",),
    "emulate": ("emulation.world_size",),
    "gpus_per_node": ("emulation.gpus_per_node",),
}
"""The other flags (argparse dest) -> the fields they may set (``config_builder.flag_values`` and
``emulation_values`` say when): ``-g`` one of its two, ``--moe_flex_dispatcher_backend`` the
dispatcher choice, ``--emulate`` the emulated world's size (``-ng``), ``-gn`` its GPUs per node."""

PRECEDENCE = "recipe < --config_file < flags < dotted overrides"


def flag_of_field(key: str) -> str | None:
    """The flag (argparse dest) that sets the dotted ``key``, if one does."""
    for dest, field in FLAG_FIELDS.items():
        if field == key:
            return dest
    return next((dest for dest, fields in OTHER_FLAG_FIELDS.items() if key in fields), None)


__all__ = ["FLAG_FIELDS", "OTHER_FLAG_FIELDS", "PRECEDENCE", "flag_of_field"]
