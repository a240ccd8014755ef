"""Reading megatron-core fields whose name or form changed between versions, in one place."""

from __future__ import annotations

from typing import Any


def graph_modules(model: Any) -> frozenset[str]:
    """Names of the per-layer CUDA-graph capture regions; empty means the whole layer.

    Reads megatron-core 0.19's ``cuda_graph_modules`` and the deprecated ``cuda_graph_scope``,
    raw (strings, ``"full"``) or normalised (``CudaGraphModule`` members).
    """
    raw = model.cuda_graph_scope if getattr(model, "cuda_graph_scope", None) else model.cuda_graph_modules
    if raw is None:
        return frozenset()
    items = raw if isinstance(raw, (list, tuple)) else (raw.split(",") if isinstance(raw, str) else [raw])
    names = {getattr(i, "name", i) for i in items}
    names.discard("")
    names.discard("full")
    return frozenset(str(n).strip() for n in names)
