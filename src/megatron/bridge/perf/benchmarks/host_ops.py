"""What the host does at EP > 1 that it does not do at EP = 1: host operations per layer and micro-batch.

An eager EP step is bound by the host when the host takes longer to issue a layer's work than the GPU
takes to run it. The count of host operations (every operator call the torch profiler records,
nested ones included: each costs the host a few microseconds on a GPU) does not depend on the
machine, so it can be compared on a CPU: the Qwen3-30B-A3B layer's structure (128 experts, top-8,
grouped-query attention, megatron-core's alltoall dispatcher) at a small width, trained by the
harness at EP = 1 with the per-GPU expert work of EP = 16 (8 experts), and in the emulated EP = 16
world over 2 x 8 with EP overlap off and on, each also with ``model.moe_chunk_sort=gather`` (arms
``off_gather``, ``on_gather``: megatron-core's chunk sort by one row gather). One step is profiled; its
operator calls are counted by name, per layer and micro-batch, and set against EP = 1
(``scripts/performance/ep_host_ops.py``).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron.bridge.perf.benchmarks.emulation_benchmark import EXPERTS, GPUS_PER_NODE, OVERLAP, TOPK, qwen3_argv

LAYERS, MICRO_BATCHES, PROFILED_STEP, STEPS = 2, 4, 3, 4
SMALL_WIDTH = (
    "model.hidden_size=64",
    "model.ffn_hidden_size=128",
    "model.moe_ffn_hidden_size=32",
    "model.num_attention_heads=4",
    "model.num_query_groups=2",
    "model.kv_channels=16",
    "model.seq_length=256",
)
"""The layer's structure kept (experts, top-k, attention groups), its width cut so a CPU trains it."""
ARMS = ("ep1", "off", "on", "off_gather", "on_gather")
GATHER_SUFFIX = "_gather"


@dataclass(frozen=True)
class HostOpsCase:
    """One profiled training run: ``ep1``, or the emulated EP=8 x ``nodes`` world with overlap off/on
    (``_gather``: and the chunk sort by one row gather)."""

    arm: str
    nodes: int = 2

    @property
    def ep(self) -> int:
        return 1 if self.arm == "ep1" else GPUS_PER_NODE * self.nodes

    def argv(self, root: Path) -> list[str]:
        """The harness command line (CPU, bf16, the profiler on one step)."""
        base = [
            *qwen3_argv("cpu", STEPS, LAYERS, root / self.arm),
            *SMALL_WIDTH,
            "--profile",
            "--profile_step_start",
            str(PROFILED_STEP),
            "--profile_step_end",
            str(PROFILED_STEP),
        ]
        if self.arm == "ep1":
            local = EXPERTS // (GPUS_PER_NODE * self.nodes)
            return [
                *base,
                *("-ng", "1", "-ep", "1"),
                f"model.num_moe_experts={local}",
                f"model.moe_router_topk={TOPK}",
                f"train.global_batch_size={MICRO_BATCHES}",
                "comm_overlap.overlap_moe_expert_parallel_comm=false",
            ]
        return [
            *base,
            *("-ng", str(self.ep), "-gn", str(GPUS_PER_NODE), "-ep", str(self.ep)),
            *("--emulate", "--network", "h100_ib400"),
            f"train.global_batch_size={MICRO_BATCHES * self.ep}",
            *OVERLAP[self.arm.removesuffix(GATHER_SUFFIX)],
            *(["model.moe_chunk_sort=gather"] if self.arm.endswith(GATHER_SUFFIX) else []),
        ]


def host_op_counts(trace: dict[str, Any]) -> collections.Counter[str]:
    """Operator calls by name in a profiled step's Chrome trace (every ``cpu_op`` event, nested ones too)."""
    return collections.Counter(
        e["name"] for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    )


def per_layer_microbatch(count: float) -> float:
    return round(count / (LAYERS * MICRO_BATCHES), 1)


def compare(counts: dict[str, collections.Counter[str]], top: int = 12) -> list[dict[str, Any]]:
    """A row per arm: its calls per layer and micro-batch, and the names that grow most over ``ep1``."""
    reference = counts["ep1"]
    rows = []
    for arm, counted in counts.items():
        grown = sorted(counted.keys() | reference.keys(), key=lambda n: reference[n] - counted[n])[:top]
        rows.append(
            dict(
                arm=arm,
                host_ops_per_step=sum(counted.values()),
                host_ops_per_layer_microbatch=per_layer_microbatch(sum(counted.values())),
                vs_ep1=round(sum(counted.values()) / max(1, sum(reference.values())), 3),
                most_grown_over_ep1=[
                    dict(
                        name=n,
                        ep1=reference[n],
                        here=counted[n],
                        per_layer_microbatch=per_layer_microbatch(counted[n] - reference[n]),
                    )
                    for n in grown
                    if counted[n] > reference[n]
                ],
            )
        )
    return rows


def read_trace(run_dir: Path) -> dict[str, Any]:
    """The one profiled step's trace a case wrote."""
    (path,) = sorted((run_dir / "profile").glob("trace_rank0_*.json"))
    return json.loads(path.read_text())


def shape() -> dict[str, Any]:
    return dict(
        layers=LAYERS,
        micro_batches_per_rank=MICRO_BATCHES,
        profiled_step=PROFILED_STEP,
        overrides=list(SMALL_WIDTH),
        experts=EXPERTS,
        topk=TOPK,
    )


def arms_of(names: Sequence[str]) -> list[HostOpsCase]:
    return [HostOpsCase(name) for name in names]
