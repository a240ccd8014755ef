"""The GPU test lane: the unit suite plus the GPU tests, run on a GPU machine, with a summary to keep.

    python scripts/gpu_test_lane.py --out runs/gpu_lane [--workers 14] [--publish with_te]
    python scripts/gpu_test_lane.py --out runs/lane_1 --workers 14 --shard 1/2      # half the test files
    python scripts/gpu_test_lane.py --merge runs/lane_1/summary.json runs/lane_2/summary.json --publish with_te

Runs ``pytest tests/unit_tests tests/gpu -m "not functional"`` with the interpreter that runs this
script, so the machine's own torch, Triton and (where installed) Transformer Engine are the ones
tested; ``src/`` is put first on ``PYTHONPATH``. It runs in two passes: every test but those marked
``gpu_timing`` with ``--workers`` processes sharing the GPU, then the ``gpu_timing`` tests (they assert
how long GPU work takes) in one process, alone on the GPU, so that no other test's kernels are
time-sliced in beside the kernels they time. Writes ``<out>/pytest.log``, ``<out>/junit.xml`` and
``<out>/summary.json``: the counts, the versions (torch, Triton, NumPy, megatron-core, Transformer
Engine), the GPU, the commit, every failure and each skip reason with its count. ``--publish NAME``
copies the summary to ``docs/testing/gpu_lane_NAME.json``. The exit status is pytest's.

A test that cannot apply on the machine is skipped with its reason (no GPU, no Transformer Engine,
a Triton interpreter that cannot run there), never left failing; CPU CI runs the same files and
skips the GPU tests.

``--shard K/N`` runs the K-th of N sets of test files, balanced by the seconds each file took in the
published summaries (``file_seconds``), so that each shard fits one call of a machine lent for a few
minutes; ``--merge`` adds the shards' summaries into one (a shard missing from the merge is an error).
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO / "docs" / "testing"
TEST_PATHS = ("tests/unit_tests", "tests/gpu")
PASSES = {
    "shared": "not functional and not gpu_timing",
    "alone": "not functional and gpu_timing",
}
"""The lane's passes and the tests each selects: ``shared`` with ``--workers`` processes, ``alone`` in one."""
NO_TESTS_COLLECTED = 5
"""pytest's exit status when a selection is empty (a shard without ``gpu_timing`` tests): not a failure."""


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """What the lane ran on: versions as this interpreter sees them, and the GPU."""
    import torch

    from megatron.bridge.utils.import_utils import describe_transformer_engine

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return dict(
        python=platform.python_version(),
        torch=torch.__version__,
        triton=version("triton"),
        numpy=version("numpy"),
        megatron_core=version("megatron-core"),
        transformer_engine=describe_transformer_engine(),
        gpu=gpu,
        gpus=torch.cuda.device_count(),
    )


def test_files() -> list[str]:
    """Every test file of the lane, relative to the repository, sorted."""
    return sorted(str(p.relative_to(REPO)) for root in TEST_PATHS for p in (REPO / root).rglob("test_*.py"))


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/3"`` -> ``(2, 3)``; a shard outside ``1..N`` is an error naming the form."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit()) or not 1 <= int(index) <= int(count):
        raise argparse.ArgumentTypeError(f"--shard {text!r}: give K/N with 1 <= K <= N, e.g. 1/2")
    return int(index), int(count)


def published_file_seconds() -> dict[str, float]:
    """Seconds per test file in the published summaries (the slower of the two where both have it)."""
    seconds: dict[str, float] = {}
    for path in PUBLISHED.glob("gpu_lane_*.json"):
        for name, value in json.loads(path.read_text()).get("file_seconds", {}).items():
            seconds[name] = max(seconds.get(name, 0.0), value)
    return seconds


def shard_files(files: list[str], shard: tuple[int, int], seconds: dict[str, float]) -> list[str]:
    """The files of shard ``(K, N)``: longest first, each to the shard with the least time so far (a file
    without a recorded time counts as the median one). Every file is in exactly one shard."""
    known = sorted(seconds.get(f) for f in files if f in seconds)
    typical = known[len(known) // 2] if known else 1.0
    loads = [0.0] * shard[1]
    mine = []
    for name in sorted(files, key=lambda f: (-seconds.get(f, typical), f)):
        target = loads.index(min(loads))
        loads[target] += seconds.get(name, typical)
        if target == shard[0] - 1:
            mine.append(name)
    return sorted(mine)


def junit_path(out: Path, lane_pass: str) -> Path:
    return out / ("junit.xml" if lane_pass == "shared" else f"junit_{lane_pass}.xml")


def pytest_argv(out: Path, workers: int, files: list[str] | None = None, lane_pass: str = "shared") -> list[str]:
    """The pytest command of one pass; the ``alone`` pass always runs in one process."""
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *(files or TEST_PATHS),
        "-m",
        PASSES[lane_pass],
        "-q",
        "-rfEs",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit_path(out, lane_pass)}",
    ]
    if workers > 1 and lane_pass == "shared":
        argv += ["-n", str(workers), "--dist", "loadfile"]
    return argv


_SITE = re.compile(r"/\S*?/site-packages/")


def scrub(text: str) -> str:
    """A message as a record keeps it: paths of this machine shortened to the repository's and the
    installed packages' own."""
    return _SITE.sub("site-packages/", text.replace(str(REPO) + "/", ""))


def outcomes(*junits: Path) -> dict:
    """Counts, failures and skip reasons from pytest's JUnit XML files (one per pass), added up."""
    counts = collections.Counter()
    failures, skips = [], collections.Counter()
    seconds: collections.Counter = collections.Counter()
    cases = [case for junit in junits if junit.exists() for case in ElementTree.parse(junit).getroot().iter("testcase")]
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        seconds[test_file_of(case.get("classname") or "")] += float(case.get("time") or 0)
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            bad = kinds.get("failure", kinds.get("error"))
            counts["failed" if "failure" in kinds else "errors"] += 1
            failures.append(dict(test=name, message=scrub(bad.get("message") or "")[:500]))
        elif "skipped" in kinds:
            counts["skipped"] += 1
            skips[scrub(kinds["skipped"].get("message") or "").removeprefix("Skipped: ")[:300]] += 1
        else:
            counts["passed"] += 1
    return dict(
        counts={k: counts.get(k, 0) for k in ("passed", "failed", "errors", "skipped")},
        failures=failures,
        skip_reasons=[dict(reason=r, tests=n) for r, n in skips.most_common()],
        file_seconds={name: round(t, 1) for name, t in sorted(seconds.items())},
    )


def test_file_of(classname: str) -> str:
    """``tests.gpu.test_x`` or ``tests.gpu.test_x.TestClass`` -> ``tests/gpu/test_x.py``."""
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py" if parts else classname


def merge(summaries: list[dict]) -> dict:
    """One summary of the lane from its shards' (counts, failures, skips and times added up)."""
    shards = sorted(tuple(s["shard"]) for s in summaries if s.get("shard"))
    count = shards[0][1] if shards else 0
    if not shards or shards != [(k, count) for k in range(1, count + 1)]:
        raise SystemExit(f"--merge needs every shard of one split exactly once; got {shards}")
    merged = {k: v for k, v in summaries[0].items() if k not in ("shard", "wall_s")}
    merged["counts"] = {k: sum(s["counts"][k] for s in summaries) for k in summaries[0]["counts"]}
    merged["failures"] = [f for s in summaries for f in s["failures"]]
    skips: collections.Counter = collections.Counter()
    for s in summaries:
        skips.update({r["reason"]: r["tests"] for r in s["skip_reasons"]})
    merged["skip_reasons"] = [dict(reason=r, tests=n) for r, n in skips.most_common()]
    merged["file_seconds"] = dict(sorted(kv for s in summaries for kv in s["file_seconds"].items()))
    merged["exit_status"] = max(s["exit_status"] for s in summaries)
    merged["shards"] = [dict(shard=list(s["shard"]), wall_s=s["wall_s"], gpu=s["gpu"]) for s in summaries]
    merged["wall_s"] = max(s["wall_s"] for s in summaries)
    return merged


def shown_command(command: list[str], files: list[str] | None, args: argparse.Namespace) -> str:
    """One pass's command as the summary records it: ``python`` for the interpreter, ``OUT`` for the
    output folder and ``--shard K/N`` for a shard's list of files."""
    if files is not None:
        command = [*command[:3], f"--shard {args.shard[0]}/{args.shard[1]}", *command[3 + len(files) :]]
    return " ".join(["python", *command[1:]]).replace(str(args.out), "OUT")


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="directory for pytest.log, junit.xml, summary.json")
    p.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (1: one process)")
    p.add_argument("--commit", help="the commit under test (default: git rev-parse HEAD)")
    p.add_argument("--publish", metavar="NAME", help="also write docs/testing/gpu_lane_NAME.json")
    p.add_argument("--shard", type=parse_shard, metavar="K/N", help="run the K-th of N balanced sets of test files")
    p.add_argument("--merge", nargs="+", type=Path, metavar="SUMMARY", help="add up the shards' summary.json files")
    args = p.parse_args(argv)
    if (args.out is None) == (args.merge is None):
        p.error("give --out DIR to run the lane, or --merge SUMMARY... to add up shards (one of the two)")
    return args


def publish(summary: dict, name: str | None) -> None:
    if name:
        PUBLISHED.mkdir(parents=True, exist_ok=True)
        (PUBLISHED / f"gpu_lane_{name}.json").write_text(json.dumps(summary, indent=2) + "\n")


def report(summary: dict) -> None:
    c = summary["counts"]
    print(
        f"GPU lane: {c['passed']} passed, {c['failed']} failed, {c['errors']} errors, {c['skipped']} skipped "
        f"in {summary['wall_s']} s; torch {summary['torch']}, Transformer Engine {summary['transformer_engine']}, "
        f"GPU {summary['gpu']}; exit {summary['exit_status']}",
        flush=True,
    )
    for failure in summary["failures"][:40]:
        print(f"  FAILED {failure['test']}: {failure['message'][:200]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.merge:
        summary = merge([json.loads(path.read_text()) for path in args.merge])
        publish(summary, args.publish)
        report(summary)
        return summary["exit_status"]
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    files = shard_files(test_files(), args.shard, published_file_seconds()) if args.shard else None
    start = time.time()
    codes, shown = [], []
    with open(args.out / "pytest.log", "w") as log:
        for lane_pass in PASSES:
            junit_path(args.out, lane_pass).unlink(missing_ok=True)  # an earlier run's record is not this one's
            command = pytest_argv(args.out, args.workers, files, lane_pass)
            log.write(f"== pass {lane_pass}: -m {PASSES[lane_pass]!r}\n")
            log.flush()
            code = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            codes.append(0 if code == NO_TESTS_COLLECTED else code)
            shown.append(shown_command(command, files, args))
    summary = dict(
        date=time.strftime("%Y-%m-%d"),
        commit=args.commit or git_commit(),
        exit_status=max(codes),
        wall_s=round(time.time() - start, 1),
        command=" && ".join(shown),
        shard=list(args.shard) if args.shard else None,
        **environment(),
        **outcomes(*(junit_path(args.out, lane_pass) for lane_pass in PASSES)),
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    publish(summary, args.publish)
    report(summary)
    return summary["exit_status"]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
