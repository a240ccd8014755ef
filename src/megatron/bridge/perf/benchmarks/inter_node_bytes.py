"""Bytes of EP dispatch and combine that cross the inter-node link: megatron-core's alltoall
dispatcher (one row per token and chosen expert: a token with two experts on one rank goes there
twice) against the node-aware one (one copy per destination node).

Counted by the emulated world's record (``inter_node_bytes`` of every all-to-all of a step), for
Qwen3-30B-A3B's layer (hidden 2048, 128 experts, top-8, seq 4096, bf16) at EP over ``nodes x 8``
GPUs. Bytes follow from the routing alone, not from the device's speed, so a CPU run counts what a
GPU run of the same data and seed would; they are modeled traffic, not a measured transfer.

What decides the bytes is kept (tokens per micro-batch, hidden size, dtype, experts, top-k, the
router); what does not is shrunk so that a count runs on a CPU in minutes (:data:`SHRUNK`: the
vocabulary, the experts' FFN width, the attention heads' number and width).

In a symmetric world every rank routes as the one emulated, so one rank's count says how its
tokens favour the experts of its own node; the count is made as the first rank of every node
(``--emulate_rank``) and averaged, which is what the layout's ranks send on average.

Beside each count stands what uniformly random top-k routing gives (an untrained router on mock
data routes close to uniformly): alltoall sends ``k (E - E_node) / E`` rows of a token to other
nodes (each chosen expert lies elsewhere with that chance; ``E_node`` experts on this node); the
node-aware dispatcher one per other node hit, each hit with chance ``1 - C(E - E_node, k) / C(E, k)``.
"""

from __future__ import annotations

from math import comb
from pathlib import Path
from typing import Any

from megatron.bridge.perf.benchmarks import emulation_benchmark as bench
from megatron.bridge.perf.benchmarks.emulation_benchmark import EXPERTS, GPUS_PER_NODE, TOPK

HIDDEN, SEQ = 2048, 4096
DISPATCHERS = {name: bench.DISPATCHERS[name] for name in ("alltoall", "node_aware")}
SHRUNK = [
    "model.vocab_size=1024",
    "model.moe_ffn_hidden_size=64",
    "model.ffn_hidden_size=256",
    "model.kv_channels=16",
    "model.num_attention_heads=4",
    "model.num_query_groups=4",
]
"""Sizes that do not change which tokens go where, made small (the full vocabulary alone would be
~7.6 TFLOP a step on the CPU)."""
EXCHANGES_PER_LAYER = 4
"""Dispatch and combine, forward and backward: the all-to-alls of one layer and micro-batch."""


def case_argv(dispatcher: str, nodes: int, root: Path, device: str, node: int = 0, steps: int = 1) -> list[str]:
    """The harness command line of one count: one layer, one micro-batch per rank, overlap off,
    emulated as the first rank of ``node``."""
    ep = GPUS_PER_NODE * nodes
    return [
        *bench.qwen3_argv(device, steps, 1, root / f"{dispatcher}_ep{ep}_node{node}"),
        "-ng",
        str(ep),
        "-gn",
        str(GPUS_PER_NODE),
        "-ep",
        str(ep),
        "--emulate",
        "--network",
        "h100_ib400",
        f"train.global_batch_size={ep}",
        "dataset.num_workers=0",
        "comm_overlap.overlap_moe_expert_parallel_comm=false",
        *SHRUNK,
        *DISPATCHERS[dispatcher],
        "--emulate_rank",
        str(node * GPUS_PER_NODE),
    ]


def counted(summary: dict[str, Any]) -> dict[str, Any]:
    """Inter-node bytes of the last step's all-to-alls, per layer and micro-batch, by group."""
    last = summary["emulation"]["steps"][-1]
    by_group = {
        group: kinds["all_to_all"]["inter_node_bytes"]
        for group, kinds in last["groups"].items()
        if "all_to_all" in kinds
    }
    return {"inter_node_bytes_per_layer": sum(by_group.values()), "by_group": by_group, "iteration": last["iteration"]}


def averaged(per_node: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts of one layout made as the first rank of each node, averaged over the nodes."""
    mean = sum(c["inter_node_bytes_per_layer"] for c in per_node) / len(per_node)
    return {
        "inter_node_bytes_per_layer": round(mean),
        "by_node": [c["inter_node_bytes_per_layer"] for c in per_node],
        "by_group": per_node[0]["by_group"],
    }


def expected_uniform(dispatcher: str, nodes: int) -> float:
    """Rows of a token sent to other nodes, per exchange, under uniform top-k routing."""
    per_node = EXPERTS // nodes
    if dispatcher == "alltoall":
        return TOPK * (EXPERTS - per_node) / EXPERTS
    return (nodes - 1) * (1 - comb(EXPERTS - per_node, TOPK) / comb(EXPERTS, TOPK))


def rows(counts: dict[tuple[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (layout, dispatcher), with the reduction against alltoall at the same layout."""
    out = []
    for (dispatcher, nodes), count in sorted(counts.items(), key=lambda item: (item[0][1], item[0][0])):
        base = counts.get(("alltoall", nodes))
        per_layer = count["inter_node_bytes_per_layer"]
        token_bytes = SEQ * HIDDEN * 2 * EXCHANGES_PER_LAYER
        out.append(
            {
                "layout": f"EP={GPUS_PER_NODE * nodes} over {nodes} x {GPUS_PER_NODE} (emulated)",
                "dispatcher": dispatcher,
                "inter_node_bytes_per_layer": per_layer,
                "inter_node_mb_per_layer": round(per_layer / 1e6, 1),
                "token_copies_per_token": round(per_layer / token_bytes, 3),
                "uniform_routing_copies_per_token": round(expected_uniform(dispatcher, nodes), 3),
                "below_alltoall": round(base["inter_node_bytes_per_layer"] / per_layer, 2)
                if base and per_layer
                else None,
                "by_node": count.get("by_node"),
                "by_group": count["by_group"],
            }
        )
    return out


__all__ = ["DISPATCHERS", "averaged", "case_argv", "counted", "expected_uniform", "rows"]
