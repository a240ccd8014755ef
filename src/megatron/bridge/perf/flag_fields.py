"""The one table of harness flags that are aliases of a config field: the parser's help text and the
config builder's values both read it, so a flag and its field are written once."""

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


__all__ = ["FLAG_FIELDS"]
