"""The GPU test lane: the unit suite plus the GPU tests, run on a GPU machine, with a summary to keep.

    python scripts/gpu_test_lane.py --out runs/gpu_lane [--workers 8] [--publish with_te]

Runs ``pytest tests/unit_tests tests/gpu -m "not functional"`` with the interpreter that runs this
script, so the machine's own torch, Triton and (where installed) Transformer Engine are the ones
tested; ``src/`` is put first on ``PYTHONPATH``. Writes ``<out>/pytest.log``, ``<out>/junit.xml`` and
``<out>/summary.json``: the counts, the versions (torch, Triton, NumPy, megatron-core, Transformer
Engine), the GPU, the commit, every failure and each skip reason with its count. ``--publish NAME``
copies the summary to ``docs/testing/gpu_lane_NAME.json``. The exit status is pytest's.

A test that cannot apply on the machine is skipped with its reason (no GPU, no Transformer Engine,
a Triton interpreter that cannot run there), never left failing; CPU CI runs the same files and
skips the GPU tests.
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
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO / "docs" / "testing"
TEST_PATHS = ("tests/unit_tests", "tests/gpu")
MARKERS = "not functional"


def version(distribution: str) -> Optional[str]:
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
        python=platform.python_version(), torch=torch.__version__, triton=version("triton"), numpy=version("numpy"),
        megatron_core=version("megatron-core"), transformer_engine=describe_transformer_engine(), gpu=gpu,
        gpus=torch.cuda.device_count(),
    )


def pytest_argv(out: Path, workers: int) -> list[str]:
    argv = [sys.executable, "-m", "pytest", *TEST_PATHS, "-m", MARKERS, "-q", "-rfEs", "-p", "no:cacheprovider",
            f"--junitxml={out / 'junit.xml'}"]
    if workers > 1:
        argv += ["-n", str(workers), "--dist", "loadfile"]
    return argv


_SITE = re.compile(r"/\S*?/site-packages/")


def scrub(text: str) -> str:
    """A message as a record keeps it: paths of this machine shortened to the repository's and the
    installed packages' own."""
    return _SITE.sub("site-packages/", text.replace(str(REPO) + "/", ""))


def outcomes(junit: Path) -> dict:
    """Counts, failures and skip reasons from pytest's JUnit XML."""
    counts = collections.Counter()
    failures, skips = [], collections.Counter()
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
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
    )


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for pytest.log, junit.xml, summary.json")
    p.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (1: one process)")
    p.add_argument("--commit", help="the commit under test (default: git rev-parse HEAD)")
    p.add_argument("--publish", metavar="NAME", help="also write docs/testing/gpu_lane_NAME.json")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    command = pytest_argv(args.out, args.workers)
    start = time.time()
    with open(args.out / "pytest.log", "w") as log:
        code = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    summary = dict(
        date=time.strftime("%Y-%m-%d"), commit=args.commit or git_commit(), exit_status=code,
        wall_s=round(time.time() - start, 1), command=" ".join(["python", *command[1:]]).replace(str(args.out), "OUT"),
        **environment(), **outcomes(args.out / "junit.xml"),
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.publish:
        PUBLISHED.mkdir(parents=True, exist_ok=True)
        (PUBLISHED / f"gpu_lane_{args.publish}.json").write_text(json.dumps(summary, indent=2) + "\n")
    c = summary["counts"]
    print(f"GPU lane: {c['passed']} passed, {c['failed']} failed, {c['errors']} errors, {c['skipped']} skipped "
          f"in {summary['wall_s']} s; torch {summary['torch']}, Transformer Engine {summary['transformer_engine']}, "
          f"GPU {summary['gpu']}; exit {code}", flush=True)
    for failure in summary["failures"][:40]:
        print(f"  FAILED {failure['test']}: {failure['message'][:200]}", flush=True)
    return code


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
