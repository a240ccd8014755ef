"""The emulated world's process groups named as megatron-core names them (``ep``, ``dp``, ``tp_ep``, ...).

The record and ``summary.json`` name each group a collective ran on; torch only numbers them. Once
megatron-core's parallel state exists, :func:`label_groups` gives each emulated group the name of the
first getter of megatron-core's that returns it, with its size.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from megatron.bridge.emulation.backend import EmulatedGroup

MEGATRON_GROUPS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("ep", "get_expert_model_parallel_group", {}),
    ("etp", "get_expert_tensor_parallel_group", {}),
    ("tp_ep", "get_expert_tensor_and_model_parallel_group", {}),
    ("edp", "get_expert_data_parallel_group", {}),
    ("tp", "get_tensor_model_parallel_group", {}),
    ("cp", "get_context_parallel_group", {}),
    ("pp", "get_pipeline_model_parallel_group", {}),
    ("dp", "get_data_parallel_group", {}),
    ("dp_cp", "get_data_parallel_group", {"with_context_parallel": True}),
    ("dist_opt", "get_intra_distributed_optimizer_instance_group", {}),
    ("tp_cp", "get_tensor_and_context_parallel_group", {}),
    ("tp_dp", "get_tensor_and_data_parallel_group", {}),
    ("tp_dp_cp", "get_tensor_and_data_parallel_group", {"with_context_parallel": True}),
    ("mp", "get_model_parallel_group", {}),
    ("embd", "get_embedding_group", {}),
    ("pos_embd", "get_position_embedding_group", {}),
)
"""megatron-core's groups (getter and arguments), most specific first: a group gets the first name
whose getter returns it."""


def megatron_group_names() -> dict[int, str]:
    """``id(group) -> name`` for megatron-core's groups of this process (after ``initialize_model_parallel``)."""
    from megatron.core import parallel_state  # deferred: the emulation package loads without megatron-core

    names: dict[int, str] = {}
    for label, getter, kwargs in MEGATRON_GROUPS:
        try:
            group = getattr(parallel_state, getter)(**kwargs)
        except Exception:  # a group this layout does not create, or a getter this version lacks
            continue
        names.setdefault(id(group), label)
    return names


def label_groups() -> None:
    """Name each emulated group by megatron-core's getter that returns it, with its size."""
    names = megatron_group_names()
    for group in [*_created_groups(), dist.group.WORLD]:
        if isinstance(group, EmulatedGroup):
            base = names.get(id(group), "world" if group is dist.group.WORLD else f"group{group.name_}")
            group.label = f"{base}[{group.n}]"


def _created_groups() -> list[Any]:
    return list(dist.distributed_c10d._world.pg_map.keys())
