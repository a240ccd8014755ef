"""Inter-node bytes of EP dispatch, alltoall against node-aware: writes
``docs/benchmarks/ep_inter_node_bytes_results.json``.

Each count is emulated harness runs (``run_script.py --emulate``, one layer, one step), one as the
first rank of each node, whose records give the bytes every all-to-all sent over the inter-node link (see
``megatron.bridge.perf.benchmarks.inter_node_bytes``). Bytes depend on the routing, not on the device: ``-g cpu``
(the default) counts what a GPU run of the same data and seed would.

    uv run python scripts/performance/ep_inter_node_bytes.py --out runs/inter_node_bytes --publish
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from megatron.bridge.perf.benchmarks import inter_node_bytes as count
from megatron.bridge.perf.benchmarks.benchmark_jobs import git_commit

REPO = Path(__file__).resolve().parents[2]
RESULTS_JSON = REPO / "docs" / "benchmarks" / "ep_inter_node_bytes_results.json"
HARNESS = REPO / "scripts" / "performance" / "run_script.py"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/inter_node_bytes"))
    p.add_argument("--nodes", default="2,4", help="comma-separated node counts (EP = 8 x nodes)")
    p.add_argument("--dispatchers", default=",".join(count.DISPATCHERS))
    p.add_argument("--device", default="cpu", help="the harness's -g: cpu, or a GPU type on a GPU machine")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for each run")
    p.add_argument("--publish", action="store_true", help=f"also write {RESULTS_JSON.relative_to(REPO)}")
    return p.parse_args(argv)


def run_one(dispatcher: str, nodes: int, node: int, args: argparse.Namespace) -> dict:
    """Train one count (as the first rank of ``node``) through the harness; its counted bytes (a
    ``RuntimeError`` if it failed)."""
    argv = count.case_argv(dispatcher, nodes, args.out, args.device, node)
    log_dir = Path(argv[argv.index("-l") + 1])
    proc = subprocess.run([sys.executable, str(HARNESS), *argv], capture_output=True, text=True, timeout=args.timeout)
    summary = log_dir / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        raise RuntimeError(f"{dispatcher} at {nodes} nodes failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return count.counted(json.loads(summary.read_text()))


def main(argv: list[str]) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started, commit = time.time(), git_commit(REPO)  # the code that runs: the commit at the start
    counts = {
        (d, int(n)): count.averaged([run_one(d, int(n), node, args) for node in range(int(n))])
        for n in args.nodes.split(",")
        for d in args.dispatchers.split(",")
    }
    results = {
        "question": "how many bytes of EP dispatch and combine cross the inter-node link, per layer and "
        "micro-batch, with megatron-core's alltoall dispatcher and with the node-aware one?",
        "modeled": "counted by the emulated world's network model h100_ib400 (8 GPUs a node): modeled traffic, "
        "not a measured transfer",
        "shape": {
            "experts": count.EXPERTS,
            "topk": count.TOPK,
            "hidden": count.HIDDEN,
            "seq": count.SEQ,
            "dtype": "bf16",
            "exchanges_per_layer": count.EXCHANGES_PER_LAYER,
        },
        "command": shlex.join(
            [
                "uv",
                "run",
                "python",
                "scripts/performance/ep_inter_node_bytes.py",
                *(a if a != str(args.out) else "runs/inter_node_bytes" for a in argv),
            ]
        ),
        "device": args.device,
        "commit": commit,
        "wall_s": round(time.time() - started, 1),
        "rows": count.rows(counts),
    }
    text = json.dumps(results, indent=2) + "\n"
    (args.out / "results.json").write_text(text)
    if args.publish:
        RESULTS_JSON.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
