"""EP overlap in an emulated cluster: the cases, the jobs that train them, and the results they give.

Every case is a ``run_script.py`` command line, resolved and validated by the harness, trained by
``pretrain()`` with the optimizer. The layout is Qwen3-30B-A3B's per-layer shape at EP over
``nodes x 8`` GPUs (hidden 2048, 128 experts, top-8, seq 4096, MBS 1, 8 micro-batches per rank),
``layers`` deep. Arms, per network and dispatcher:

* ``ep1``: EP=1 on one real GPU with the same per-GPU expert work (8 experts, top-8) and no
  communication: the compute-only reference of a real GPU;
* ``free``: the emulated world with network ``free`` (every collective costs nothing), overlap off;
* ``off`` / ``on`` / ``on_delay_wgrad``: the emulated world on the network, EP overlap off, on, and
  on with delayed expert weight gradients.

Hidden share = (off - on) / (off - free): how much of what communication added to the step EP
overlap takes away. Times of the emulated arms include modeled (not measured) communication.
The emulated cases share one process (one start-up); ``ep1`` runs in a job of its own (another
world). Within a job the cases are interleaved, repeat by repeat.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

ARMS = ("ep1", "free", "off", "on", "on_delay_wgrad")
DISPATCHERS = {
    "alltoall": [],
    "sorted": ["model.torch_native_dispatcher=sorted", "model.torch_native_ep_transport=nccl"],
}
"""Dispatchers the product offers at EP > 1 without a flex backend: megatron-core's alltoall, and
the torch-native sorted one over ``all_to_all_single``."""
OVERLAP = {
    "free": ["comm_overlap.overlap_moe_expert_parallel_comm=false"],
    "off": ["comm_overlap.overlap_moe_expert_parallel_comm=false"],
    "on": ["comm_overlap.overlap_moe_expert_parallel_comm=true", "comm_overlap.delay_wgrad_compute=false"],
    "on_delay_wgrad": ["comm_overlap.overlap_moe_expert_parallel_comm=true", "comm_overlap.delay_wgrad_compute=true"],
}
MICRO_BATCHES = 8


@dataclass(frozen=True)
class Case:
    """One training run of the benchmark."""

    arm: str
    network: str
    dispatcher: str
    repeat: int
    layers: int
    nodes: int
    steps: int
    gpu: str

    @property
    def name(self) -> str:
        return f"{self.arm}_{self.network}_{self.dispatcher}_r{self.repeat}"

    @property
    def world(self) -> int:
        return 1 if self.arm == "ep1" else 8 * self.nodes

    def argv(self, root: Path) -> list[str]:
        """The harness command line of this case."""
        base = ["-m", "qwen", "-mr", "qwen3_30b_a3b", "--task", "pretrain", "-g", self.gpu, "-c", "bf16",
                "--max_steps", str(self.steps), "--cuda_graph_impl", "none", "--moe_flex_dispatcher_backend",
                "None", "--tokenizer_type", "NullTokenizer", "model.moe_shared_expert_overlap=false",
                f"model.num_layers={self.layers}", "logger.log_interval=1", "-l", str(root / self.name)]
        if self.arm == "ep1":
            return [*base, "-ng", "1", "-ep", "1", "model.num_moe_experts=8", "model.moe_router_topk=8",
                    f"train.global_batch_size={MICRO_BATCHES}", "comm_overlap.overlap_moe_expert_parallel_comm=false"]
        network = "free" if self.arm == "free" else self.network
        return [*base, "-ng", str(self.world), "-gn", "8", "-ep", str(self.world), "--emulate", "--network", network,
                f"train.global_batch_size={MICRO_BATCHES * self.world}", *OVERLAP[self.arm],
                *DISPATCHERS[self.dispatcher]]


def plan(networks: Sequence[str], dispatchers: Sequence[str], repeats: int, layers: int, nodes: int, steps: int,
         gpu: str, arms: Sequence[str] = ARMS) -> dict[str, list[Case]]:
    """The cases of each job (``ep1`` and ``emulated``), interleaved repeat by repeat. ``free``
    does not depend on the network: it runs once per dispatcher and repeat."""
    jobs: dict[str, list[Case]] = {"ep1": [], "emulated": []}
    for repeat in range(1, repeats + 1):
        if "ep1" in arms:
            jobs["ep1"].append(Case("ep1", "none", "none", repeat, layers, nodes, steps, gpu))
        for dispatcher in dispatchers:
            if "free" in arms:
                jobs["emulated"].append(Case("free", "free", dispatcher, repeat, layers, nodes, steps, gpu))
            for network in networks:
                jobs["emulated"] += [Case(arm, network, dispatcher, repeat, layers, nodes, steps, gpu)
                                     for arm in ("off", "on", "on_delay_wgrad") if arm in arms]
    return {name: cases for name, cases in jobs.items() if cases}


# --------------------------------------------------------------------------------------------- results
def steady(values: Sequence[float], start: int) -> list[float]:
    """Values of iterations ``start`` and later (1-based)."""
    return list(values[start - 1:])


def case_result(case: Case, summary: dict[str, Any], window_start: int) -> dict[str, Any]:
    """What one finished case measured: its steady step times, modeled communication by group, the
    emulation's own host cost, model TFLOP/s per GPU."""
    steps = steady(summary["step_times_s"], window_start)
    result: dict[str, Any] = {"step_s": statistics.fmean(steps), "step_s_all": summary["step_times_s"],
                              "tflops_per_gpu": _tflops(summary, steps)}
    emulation = summary.get("emulation")
    if emulation:
        window = [s for s in emulation["steps"] if s["iteration"] >= window_start]
        result["modeled_comm_s"] = statistics.fmean(s["modeled_s"] for s in window)
        result["emulation_host_s"] = statistics.fmean(s["host_s"] for s in window)
        result["modeled_comm_s_by_group"] = _by_group(window)
    return result


def _tflops(summary: dict[str, Any], steps: Sequence[float]) -> Optional[float]:
    flops = summary.get("model_flops_per_step")
    world = summary.get("world_size")
    if not flops or not world or not steps:
        return None
    return flops / world / statistics.fmean(steps) / 1e12


def _by_group(window: Sequence[dict[str, Any]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for step in window:
        for group, kinds in step["groups"].items():
            for kind, tally in kinds.items():
                key = f"{group} {kind}"
                totals[key] = totals.get(key, 0.0) + tally["modeled_s"] / len(window)
    return {k: v for k, v in sorted(totals.items()) if v > 0}


def hidden_share(off: float, on: float, free: float) -> Optional[float]:
    """(off - on) / (off - free): the share of what communication added to the step that overlap hid."""
    return (off - on) / (off - free) if off - free > 0 else None


def rows(cases: Sequence[Case], results: dict[str, dict[str, Any]], commit: str, nodes: int) -> list[dict[str, Any]]:
    """One row per (network, dispatcher, arm): every repeat's step time, the means, the hidden share."""
    grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for case in cases:
        if case.name in results:
            key = (case.network, case.dispatcher, case.arm)
            grouped.setdefault(key, []).append(results[case.name])
    out = []
    for (network, dispatcher, arm), runs in sorted(grouped.items()):
        row = {"layout": "EP=1 on one GPU" if arm == "ep1" else f"EP={8 * nodes} over {nodes} x 8 (emulated)",
               "network": network, "dispatcher": dispatcher, "arm": arm, "mbs": 1, "micro_batches": MICRO_BATCHES,
               "step_s": [r["step_s"] for r in runs], "tflops_per_gpu": _mean(r["tflops_per_gpu"] for r in runs),
               "commit": commit}
        if "modeled_comm_s" in runs[0]:
            row["modeled_comm_s"] = _mean(r["modeled_comm_s"] for r in runs)
            row["modeled_comm_s_by_group"] = runs[0]["modeled_comm_s_by_group"]
            row["emulation_host_s"] = _mean(r["emulation_host_s"] for r in runs)
        out.append(row)
    _add_hidden_shares(out)
    return out


def _mean(values: Any) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _add_hidden_shares(table: list[dict[str, Any]]) -> None:
    by_key = {(r["network"], r["dispatcher"], r["arm"]): r for r in table}
    for row in table:
        if row["arm"] not in ("on", "on_delay_wgrad"):
            continue
        off = by_key.get((row["network"], row["dispatcher"], "off"))
        free = by_key.get(("free", row["dispatcher"], "free"))
        if off and free:
            row["hidden_share"] = hidden_share(statistics.fmean(off["step_s"]), statistics.fmean(row["step_s"]),
                                               statistics.fmean(free["step_s"]))


def merge_rows(tables: Sequence[list[dict[str, Any]]], ran_at: Optional[str]) -> list[dict[str, Any]]:
    """Rows of separate runs joined by (network, dispatcher, arm): their repeats side by side, the
    means pooled, hidden shares recomputed from the pooled means."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for table in tables:
        for row in table:
            key = (row["network"], row["dispatcher"], row["arm"])
            if key not in merged:
                merged[key] = {**row, "step_s": [], "runs": 0}
                merged[key].pop("hidden_share", None)
            target = merged[key]
            runs = target["runs"]
            target["step_s"] = target["step_s"] + list(row["step_s"])
            for field in ("tflops_per_gpu", "modeled_comm_s", "emulation_host_s"):
                if row.get(field) is not None:
                    target[field] = ((target.get(field) or 0.0) * runs + row[field]) / (runs + 1) if runs else row[field]
            target["runs"] = runs + 1
            target["commit"] = ran_at or row["commit"]
    out = [merged[key] for key in sorted(merged)]
    for row in out:
        row.pop("runs")
    _add_hidden_shares(out)
    return out


def write_results(path: Path, table: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "rows": table}, indent=2) + "\n")
