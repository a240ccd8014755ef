"""Fine-grained activation offloading on GPUs without Transformer Engine.

megatron-core 0.19.2's offload manager (``pipeline_parallel/fine_grained_activation_offload.py``)
moves module inputs to host memory with its own saved-tensor hooks, and on entering each offloaded
module it also switches on Transformer Engine's ``cpu_offload.CPUOffloadEnabled``, a flag that only
TE's own modules read. Without TE that module is ``None`` and megatron-core raises "TE CPU offload is
not available" at the first offloaded module, although no TE module exists to read the flag (seen
on an H200 with this package's torch-native layers). A run without TE therefore gets a flag of its
own; the offloading itself is megatron-core's, unchanged.
"""

from __future__ import annotations

import types
from typing import Any


def provide_offload_flag() -> bool:
    """Give megatron-core a ``cpu_offload`` flag holder where Transformer Engine provides none;
    ``True`` when one was installed (TE absent), ``False`` when TE's own is there."""
    # Deferred: megatron-core's TE extension module is imported only for a run that offloads.
    from megatron.core.extensions import transformer_engine as te_extension

    if getattr(te_extension, "cpu_offload", None) is not None:
        return False
    te_extension.cpu_offload = types.SimpleNamespace(CPUOffloadEnabled=False)
    return True


def offloaded_bytes() -> dict[str, Any]:
    """What megatron-core's offload manager moved to host memory per step on this rank: the bytes of
    each offloaded module group and their total, as the manager counted them after its warm-up step
    (empty groups and a zero total before that step, or when nothing was offloaded)."""
    # Deferred: megatron-core's offload module is loaded only for a run that offloads.
    from megatron.core.pipeline_parallel.fine_grained_activation_offload import PipelineOffloadManager

    groups = getattr(PipelineOffloadManager.OFFLOAD_MGR, "offload_summary_bytes", None) or {}
    return dict(bytes_per_step=int(sum(groups.values())), by_module=dict(groups))
