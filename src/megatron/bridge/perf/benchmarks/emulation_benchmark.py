"""EP overlap in an emulated cluster: the cases, the jobs that train them, and the results they give.

Every case is a ``run_script.py`` command line, resolved and validated by the harness, trained by
``pretrain()`` with the optimizer. The layout is Qwen3-30B-A3B's per-layer shape at EP over
``nodes x 8`` GPUs (hidden 2048, 128 experts, top-8, seq 4096, MBS 1, 8 micro-batches per rank
unless ``micro_batches`` says otherwise), ``layers`` deep. Arms, per network and dispatcher:

* ``ep1``: EP=1 on one real GPU with the same per-GPU expert work (8 experts, top-8) and no
  communication: the compute-only reference of a real GPU;
* ``free``: the emulated world with network ``free`` (every collective costs nothing), overlap off;
* ``off`` / ``on`` / ``on_delay_wgrad``: the emulated world on the network, EP overlap off, on, and
  on with delayed expert weight gradients.

Hidden share = (off - on) / (off - free): how much of what communication added to the step EP
overlap takes away. Hidden by trace (profiled rows) = the share of the profiled step's dispatch and
combine that ran beside compute on another stream, the measure of NVIDIA's and DeepSeek's published
figures. Times of the emulated arms include modeled (not measured) communication.
The emulated cases share one process (one start-up); ``ep1`` runs in a job of its own (another
world). Within a job the cases are interleaved, repeat by repeat. ``ep1`` needs 8 experts a GPU (the
per-GPU work of EP=16); at more nodes it is left out and ``free`` is the compute-only reference.

Profiled cases (``profile_arms``) run once more each with the torch profiler on their last step;
its :func:`~megatron.bridge.perf.analysis.step_anatomy.step_anatomy` (GPU idle, host waits, exposed
communication) goes into the row of their arm, and the unprofiled steps of the window before it count
as one more run of that row (the profiler starts only at the profiled step), so a 48-layer profile
also buys a repeat.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron.bridge.models.dispatch.path_registry import benchmark_arms
from megatron.bridge.models.dispatch.sorted_nvshmem import WHOLE_ITERATION_GRAPH
from megatron.bridge.perf.analysis.exchange_exposure import ExchangeCountMismatch, exchange_exposure
from megatron.bridge.perf.analysis.step_anatomy import step_anatomy

ARMS = ("ep1", "free", "off", "on", "on_delay_wgrad")
GPUS_PER_NODE = 8
EXPERTS, TOPK = 128, 8
GRAPH = list(WHOLE_ITERATION_GRAPH)
"""The whole-iteration CUDA graph, captured in step 3 (before the steady window)."""
DISPATCHERS: dict[str, list[str]] = benchmark_arms(GPUS_PER_NODE)
"""Dispatcher arm -> its harness arguments: the arms of every dispatch path the emulated world can run
(``models/dispatch/``): megatron-core's alltoall, the torch-native sorted one over ``all_to_all_single``
(split sizes through the host) and over NVSHMEM (split sizes stay on the GPU; emulated by
``models/torch_native/emulated_exchange.py``), the latter also with its forward+backward captured in a
whole-iteration CUDA graph (the one EP > 1 step that can be: nothing in it reads the GPU on the host),
and the node-aware one (each token crosses the inter-node link once per node). The flex backends'
buffers cannot be emulated. With a graphed dispatcher in the plan, ``ep1`` also runs graphed
(dispatcher ``graph``), so graphed arms have a graphed compute-only reference."""
OVERLAP = {
    "free": ["comm_overlap.overlap_moe_expert_parallel_comm=false"],
    "off": ["comm_overlap.overlap_moe_expert_parallel_comm=false"],
    "on": ["comm_overlap.overlap_moe_expert_parallel_comm=true", "comm_overlap.delay_wgrad_compute=false"],
    "on_delay_wgrad": ["comm_overlap.overlap_moe_expert_parallel_comm=true", "comm_overlap.delay_wgrad_compute=true"],
}
MICRO_BATCHES = 8
"""Micro-batches per rank a step (``--micro-batches``): the combined 1F1B schedule pairs the forward of
one with the backward of another, so the first forward and the last backward have no partner."""
RowKey = tuple[int, int, int, str, str, str]
"""A row of the table: (EP size, layers, micro-batches, network, dispatcher, arm)."""


def qwen3_argv(gpu: str, steps: int, layers: int, log_dir: Path) -> list[str]:
    """The harness flags every emulated benchmark shares: Qwen3-30B-A3B's recipe ``layers`` deep,
    bf16, no CUDA graph, megatron-core's alltoall unless a dispatcher is asked for, and routing
    forced balanced (megatron-core's benchmarking switch: random router logits). Without it the
    symmetric world's stand-in values steer the routing as training goes, and every peer routes as
    this rank does, so the rows its experts get, and the step, drift from run to run."""
    return [
        "-m",
        "qwen",
        "-mr",
        "qwen3_30b_a3b",
        "--task",
        "pretrain",
        "-g",
        gpu,
        "-c",
        "bf16",
        "--max_steps",
        str(steps),
        "--cuda_graph_impl",
        "none",
        "--moe_flex_dispatcher_backend",
        "None",
        "--tokenizer_type",
        "NullTokenizer",
        "model.moe_shared_expert_overlap=false",
        "model.moe_router_force_load_balancing=true",
        f"model.num_layers={layers}",
        "-l",
        str(log_dir),
    ]


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
    profile: bool = False
    micro_batches: int = MICRO_BATCHES

    @property
    def name(self) -> str:
        suffix = "prof" if self.profile else f"r{self.repeat}"
        batches = "" if self.micro_batches == MICRO_BATCHES else f"_mb{self.micro_batches}"
        return f"{self.arm}_{self.network}_{self.dispatcher}_ep{self.ep}{batches}_{suffix}"

    @property
    def profiled_step(self) -> int:
        """The step a profiled case traces: its last, so the steps before it are timed unprofiled."""
        return self.steps

    @property
    def ep(self) -> int:
        """The EP size of the layout this case stands for (``ep1`` stands for one GPU of it)."""
        return GPUS_PER_NODE * self.nodes

    @property
    def key(self) -> RowKey:
        """The row this case belongs to."""
        return self.ep, self.layers, self.micro_batches, self.network, self.dispatcher, self.arm

    @property
    def world(self) -> int:
        return 1 if self.arm == "ep1" else self.ep

    def argv(self, root: Path) -> list[str]:
        """The harness command line of this case."""
        base = [*qwen3_argv(self.gpu, self.steps, self.layers, root / self.name), "logger.log_interval=1"]
        if self.profile:
            step = str(self.profiled_step)
            base += ["--profile", "--profile_step_start", step, "--profile_step_end", step]
        if self.arm == "ep1":
            return [
                *base,
                "-ng",
                "1",
                "-ep",
                "1",
                f"model.num_moe_experts={EXPERTS // self.ep}",
                f"model.moe_router_topk={TOPK}",
                *(GRAPH if self.dispatcher == "graph" else []),
                f"train.global_batch_size={self.micro_batches}",
                "comm_overlap.overlap_moe_expert_parallel_comm=false",
            ]
        network = "free" if self.arm == "free" else self.network
        return [
            *base,
            "-ng",
            str(self.world),
            "-gn",
            str(GPUS_PER_NODE),
            "-ep",
            str(self.world),
            "--emulate",
            "--network",
            network,
            f"train.global_batch_size={self.micro_batches * self.world}",
            *OVERLAP[self.arm],
            *DISPATCHERS[self.dispatcher],
        ]


def plan(
    networks: Sequence[str],
    dispatchers: Sequence[str],
    repeats: int,
    layers: int,
    nodes: int,
    steps: int,
    gpu: str,
    arms: Sequence[str] = ARMS,
    profile_arms: Sequence[str] = (),
    micro_batches: int = MICRO_BATCHES,
) -> dict[str, list[Case]]:
    """The cases of each job (``ep1`` and ``emulated``), interleaved repeat by repeat, then the
    profiled ones. ``free`` does not depend on the network: it runs once per dispatcher and repeat."""
    if EXPERTS // (GPUS_PER_NODE * nodes) < TOPK:  # EP=1 cannot do the same per-GPU work
        arms, profile_arms = [a for a in arms if a != "ep1"], [a for a in profile_arms if a != "ep1"]
    jobs: dict[str, list[Case]] = {"ep1": [], "emulated": []}
    ep1_modes = ["none", *(["graph"] if any(d.endswith("_graph") for d in dispatchers) else [])]
    shape = (layers, nodes, steps, gpu)
    for repeat in [*range(1, repeats + 1), 0]:
        chosen, profile = (arms, False) if repeat else (profile_arms, True)
        if "ep1" in chosen:
            jobs["ep1"] += [Case("ep1", "none", mode, repeat, *shape, profile, micro_batches) for mode in ep1_modes]
        for dispatcher in dispatchers:
            if "free" in chosen:
                jobs["emulated"].append(Case("free", "free", dispatcher, repeat, *shape, profile, micro_batches))
            for network in networks:
                jobs["emulated"] += [
                    Case(arm, network, dispatcher, repeat, *shape, profile, micro_batches)
                    for arm in ("off", "on", "on_delay_wgrad")
                    if arm in chosen
                ]
    return {name: cases for name, cases in jobs.items() if cases}


# --------------------------------------------------------------------------------------------- results
def steady(values: Sequence[float], start: int) -> list[float]:
    """Values of iterations ``start`` and later (1-based)."""
    return list(values[start - 1 :])


def case_result(case: Case, summary: dict[str, Any], window_start: int, run_dir: Path | None = None) -> dict[str, Any]:
    """What one finished case measured: its steady step times, modeled communication by group, the
    emulation's own host cost, model TFLOP/s per GPU, its peak allocated GPU memory; for a profiled
    case, the step's anatomy, and the same figures over the window's steps before the profiled one
    (none where the window starts at the profiled step)."""
    if not case.profile:
        return _timed_result(summary, window_start, len(summary["step_times_s"]))
    if run_dir is None:
        raise ValueError(f"case {case.name}: a profiled case's result is read from its trace, so run_dir is needed")
    trace = run_dir / "profile" / f"trace_rank0_steps{case.profiled_step}-{case.profiled_step}.json"
    timed = steady(summary.get("step_times_s", [])[: case.profiled_step - 1], window_start)
    result = _timed_result(summary, window_start, case.profiled_step - 1) if timed else {}
    if trace.is_file():
        result["profile"] = _profile(case, trace)
    return result


def _timed_result(summary: dict[str, Any], window_start: int, last_step: int) -> dict[str, Any]:
    """Step times, TFLOP/s, peak memory and modeled communication of steps ``window_start..last_step``."""
    steps = steady(summary["step_times_s"][:last_step], window_start)
    result: dict[str, Any] = {
        "step_s": statistics.fmean(steps),
        "step_s_all": summary["step_times_s"],
        "tflops_per_gpu": _tflops(summary, steps),
        "peak_memory_gib": summary.get("peak_memory_gib"),
    }
    emulation = summary.get("emulation")
    if emulation:
        window = [s for s in emulation["steps"] if window_start <= s["iteration"] <= last_step]
        result["modeled_comm_s"] = statistics.fmean(s["modeled_s"] for s in window)
        result["emulation_host_s"] = statistics.fmean(s["host_s"] for s in window)
        result["modeled_comm_s_by_group"] = _by_group(window, "modeled_s")
        result["emulation_host_s_by_group"] = _by_group(window, "host_s")
        result["calls_by_group"] = _by_group(window, "calls")
    return result


def _profile(case: Case, trace: Path) -> dict[str, Any]:
    """The profiled step's anatomy; with EP overlap on, also which exchanges stayed exposed, by their
    place in megatron-core's schedule (where the dispatcher issues one kernel per exchange)."""
    profile: dict[str, Any] = step_anatomy(trace).as_dict()
    if case.arm in ("on", "on_delay_wgrad"):
        try:
            profile["exchange_exposure"] = exchange_exposure(trace, case.layers, case.micro_batches)
        except ExchangeCountMismatch:
            pass  # megatron-core's alltoall dispatcher: several kernels per exchange, no place to give each
    return profile


def _tflops(summary: dict[str, Any], steps: Sequence[float]) -> float | None:
    flops = summary.get("model_flops_per_step")
    world = summary.get("world_size")
    if not flops or not world or not steps:
        return None
    return flops / world / statistics.fmean(steps) / 1e12


def _by_group(window: Sequence[dict[str, Any]], field: str) -> dict[str, float]:
    """``"group kind" -> mean of the tallies' ``field`` per step`` (nonzero ones)."""
    totals: dict[str, float] = {}
    for step in window:
        for group, kinds in step["groups"].items():
            for kind, tally in kinds.items():
                key = f"{group} {kind}"
                totals[key] = totals.get(key, 0.0) + tally.get(field, 0.0) / len(window)
    return {k: v for k, v in sorted(totals.items()) if v > 0}


def hidden_share(off: float, on: float, free: float) -> float | None:
    """(off - on) / (off - free): the share of what communication added to the step that overlap hid."""
    return (off - on) / (off - free) if off - free > 0 else None


def hidden_by_trace(profile: dict[str, Any]) -> float | None:
    """The share of the profiled step's dispatch and combine that ran beside compute kernels on another
    stream (the trace's measure, which NVIDIA's and DeepSeek's published figures use; ``None`` where the
    trace holds no dispatch or combine)."""
    comm = profile.get("dispatch_combine_ms") or 0.0
    exposed = profile.get("dispatch_combine_exposed_ms")
    if comm <= 0 or exposed is None:
        return None
    return (comm - exposed) / comm


def rows(
    cases: Sequence[Case], results: dict[str, dict[str, Any]], commit: str, nodes: int, device: str | None = None
) -> list[dict[str, Any]]:
    """One row per (EP, layers, network, dispatcher, arm): every repeat's step time, the means, the
    highest peak of allocated GPU memory, the hidden share, the GPU that ran it, and the anatomy of its
    profiled step (with its ``hidden_by_trace``) where one ran."""
    grouped: dict[RowKey, list[dict[str, Any]]] = {}
    profiles: dict[RowKey, dict[str, Any]] = {}
    for case in cases:
        result = results.get(case.name, {})
        if result.get("profile"):
            profiles[case.key] = result["profile"]
        if "step_s" in result:
            grouped.setdefault(case.key, []).append(result)
    out = []
    for key, runs in sorted(grouped.items()):
        ep, layers, micro_batches, network, dispatcher, arm = key
        row = {
            "layout": f"EP=1 on one GPU ({EXPERTS // ep} experts, top-{TOPK})"
            if arm == "ep1"
            else f"EP={ep} over {ep // GPUS_PER_NODE} x {GPUS_PER_NODE} (emulated)",
            "ep": ep,
            "layers": layers,
            "network": network,
            "dispatcher": dispatcher,
            "arm": arm,
            "mbs": 1,
            "micro_batches": micro_batches,
            "step_s": [r["step_s"] for r in runs],
            "tflops_per_gpu": _mean(r["tflops_per_gpu"] for r in runs),
            "peak_memory_gib": _max(r.get("peak_memory_gib") for r in runs),
            "commit": commit,
            "device": device,
        }
        if "modeled_comm_s" in runs[0]:
            row["modeled_comm_s"] = _mean(r["modeled_comm_s"] for r in runs)
            row["modeled_comm_s_by_group"] = runs[0]["modeled_comm_s_by_group"]
            for field in ("emulation_host_s_by_group", "calls_by_group"):
                if field in runs[0]:
                    row[field] = runs[0][field]
            row["emulation_host_s"] = _mean(r["emulation_host_s"] for r in runs)
        if key in profiles:
            row["profile"] = profiles[key]
        out.append(row)
    _add_hidden_shares(out)
    return out


def _mean(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def row_key(row: dict[str, Any]) -> RowKey:
    """Rows written before they carried their EP size and depth were EP=16, 4 layers deep."""
    return (
        row.get("ep", 16),
        row.get("layers", 4),
        row.get("micro_batches", MICRO_BATCHES),
        row["network"],
        row["dispatcher"],
        row["arm"],
    )


def _add_hidden_shares(table: list[dict[str, Any]]) -> None:
    """Each overlap row's ``hidden_share`` from the step times of its layout's ``off`` and ``free``, and
    each profiled row's ``hidden_by_trace`` from its trace; figures a row carried in are recomputed."""
    by_key = {row_key(r): r for r in table}
    for row in table:
        row.pop("hidden_share", None)
        row.pop("hidden_by_trace", None)
        traced = hidden_by_trace(row["profile"]) if row.get("profile") else None
        if traced is not None:
            row["hidden_by_trace"] = traced
        if row["arm"] not in ("on", "on_delay_wgrad"):
            continue
        shape = row_key(row)[:3]
        off = by_key.get((*shape, row["network"], row["dispatcher"], "off"))
        free = by_key.get((*shape, "free", row["dispatcher"], "free"))
        if off and free:
            row["hidden_share"] = hidden_share(
                statistics.fmean(off["step_s"]), statistics.fmean(row["step_s"]), statistics.fmean(free["step_s"])
            )


class MixedDevicesError(ValueError):
    """Runs of one row made on different GPUs: their step times are not repeats of each other."""


class MixedCommitsError(ValueError):
    """Runs of one row made at different commits: their step times are not repeats of each other."""


def merge_rows(
    tables: Sequence[list[dict[str, Any]]],
    ran_at: Sequence[str | None],
    devices: Sequence[str | None] | None = None,
) -> list[dict[str, Any]]:
    """Rows of separate runs joined by (EP, layers, micro-batches, network, dispatcher, arm): their repeats
    side by side, the means pooled, hidden shares recomputed from the pooled means (a profile: the last
    run's). Each row names its commit (its run's in ``ran_at``, else its own) and its GPU (its own, else
    its run's in ``devices``); one row's runs on two different GPUs, or at two commits, are refused
    (:class:`MixedDevicesError`, :class:`MixedCommitsError`)."""
    merged: dict[RowKey, dict[str, Any]] = {}
    for index, table in enumerate(tables):
        run_device = devices[index] if devices is not None else None
        for row in table:
            key = row_key(row)
            device = row.get("device") or run_device
            commit = ran_at[index] or row["commit"]
            if key not in merged:
                merged[key] = {**row, "step_s": [], "runs": 0, "device": device, "commit": commit}
            target = merged[key]
            _same_device(key, target["device"], device)
            _same_commit(key, target["commit"], commit)
            target["device"] = target["device"] or device
            runs = target["runs"]
            target["step_s"] = target["step_s"] + list(row["step_s"])
            for field in ("tflops_per_gpu", "modeled_comm_s", "emulation_host_s"):
                if row.get(field) is not None:
                    pooled = ((target.get(field) or 0.0) * runs + row[field]) / (runs + 1)
                    target[field] = pooled if runs else row[field]
            peak = _max([target.get("peak_memory_gib"), row.get("peak_memory_gib")])
            if peak is not None:
                target["peak_memory_gib"] = peak
            target["runs"] = runs + 1
            if row.get("profile"):
                target["profile"] = row["profile"]
    out = [merged[key] for key in sorted(merged)]
    for row in out:
        row.pop("runs")
    _add_hidden_shares(out)
    return out


def _row_named(key: RowKey) -> str:
    """``row (EP=16, 48 layers, ...)``: a merged row, as the merge's refusals name it."""
    ep, layers, micro_batches, network, dispatcher, arm = key
    return (
        f"row (EP={ep}, {layers} layers, {micro_batches} micro-batches, network {network}, dispatcher "
        f"{dispatcher}, arm {arm})"
    )


def _same_device(key: RowKey, kept: str | None, new: str | None) -> None:
    if kept and new and kept != new:
        raise MixedDevicesError(
            f"{_row_named(key)} has runs on {kept} and on {new}: step times of different GPUs are not "
            "repeats of one another. Fix: merge each GPU's runs into a file of its own (--out) and compare "
            "the files side by side"
        )


def _same_commit(key: RowKey, kept: str, new: str) -> None:
    if kept != new:
        raise MixedCommitsError(
            f"{_row_named(key)} has runs at {kept} and at {new}: step times of different code are not "
            "repeats of one another. Fix: where both runs ran the same code, name it for both (--ran-at "
            "FILE=COMMIT); otherwise merge each commit's runs into a file of its own (--out)"
        )


def write_results(path: Path, table: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "rows": table}, indent=2) + "\n")
