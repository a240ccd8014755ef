"""The GPU test lane's shards and summaries (``scripts/gpu_test_lane.py``), on synthetic records: every
test file runs in exactly one shard, the shards take about the same time, and merging the shards'
summaries gives the whole lane's."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_test_lane.py"


@pytest.fixture(scope="module")
def lane():
    spec = importlib.util.spec_from_file_location("gpu_test_lane", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILES = [f"tests/unit_tests/test_{i}.py" for i in range(9)] + ["tests/gpu/test_slow.py", "tests/gpu/test_new.py"]
SECONDS = {**{f"tests/unit_tests/test_{i}.py": float(i + 1) for i in range(9)}, "tests/gpu/test_slow.py": 40.0}


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_every_file_runs_in_exactly_one_shard(lane, count):
    shards = [lane.shard_files(FILES, (k, count), SECONDS) for k in range(1, count + 1)]
    assert sorted(f for shard in shards for f in shard) == sorted(FILES)


def test_the_shards_are_balanced_by_the_recorded_seconds(lane):
    """85 s of recorded files and one unrecorded (counted at the median, 6 s) split 46 / 45 s: longest
    first, each to the shard with the least so far."""
    typical = 6.0
    loads = [sum(SECONDS.get(f, typical) for f in lane.shard_files(FILES, (k, 2), SECONDS)) for k in (1, 2)]
    assert loads == [46.0, 45.0]
    assert "tests/gpu/test_slow.py" in lane.shard_files(FILES, (1, 2), SECONDS)


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_a_shard_outside_one_to_n_is_refused(lane, text):
    with pytest.raises(argparse.ArgumentTypeError, match="K/N"):
        lane.parse_shard(text)


JUNIT = """<testsuites><testsuite>
<testcase classname="tests.gpu.test_slow" name="test_a" time="2.5"/>
<testcase classname="tests.gpu.test_slow.TestGroup" name="test_b" time="1.5"><skipped message="needs TE"/></testcase>
<testcase classname="tests.unit_tests.test_3" name="test_c" time="0.25"><failure message="boom"/></testcase>
</testsuite></testsuites>"""


def test_the_summary_counts_outcomes_and_seconds_per_file(lane, tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    found = lane.outcomes(tmp_path / "junit.xml")
    assert found["counts"] == dict(passed=1, failed=1, errors=0, skipped=1)
    assert found["file_seconds"] == {"tests/gpu/test_slow.py": 4.0, "tests/unit_tests/test_3.py": 0.2}
    assert found["failures"] == [dict(test="tests.unit_tests.test_3::test_c", message="boom")]


PASSED = """<testsuites><testsuite>
<testcase classname="tests.unit_tests.test_3" name="test_c" time="0.5"/>
</testsuite></testsuites>"""
TIMED_FAILURE = """<testsuites><testsuite>
<testcase classname="tests.gpu.test_timing" name="test_t" time="1.0"><failure message="slow"/></testcase>
</testsuite></testsuites>"""


def test_the_timing_tests_run_alone_after_the_others(lane, tmp_path):
    shared = lane.pytest_argv(tmp_path, 14, lane_pass="shared")
    alone = lane.pytest_argv(tmp_path, 14, lane_pass="alone")
    assert list(lane.PASSES) == ["shared", "alone"]
    assert shared[shared.index("-m", 3) + 1] == "not functional and not gpu_timing" and "-n" in shared
    assert alone[alone.index("-m", 3) + 1] == "not functional and gpu_timing" and "-n" not in alone


@pytest.mark.parametrize(
    "alone_result, exit_status, counts",
    [
        ((5, None), 0, dict(passed=1, failed=0, errors=0, skipped=0)),  # a shard with no timing test
        ((1, TIMED_FAILURE), 1, dict(passed=1, failed=1, errors=0, skipped=0)),
    ],
    ids=["no-timing-tests-selected", "a-timing-test-failed"],
)
def test_the_summary_adds_up_both_passes(lane, tmp_path, monkeypatch, alone_result, exit_status, counts):
    results = {"shared": (0, PASSED), "alone": alone_result}
    ran = []

    def fake_run(command, **_):
        lane_pass = next(p for p, m in lane.PASSES.items() if command[command.index("-m", 3) + 1] == m)
        ran.append(lane_pass)
        code, junit = results[lane_pass]
        if junit:
            lane.junit_path(tmp_path, lane_pass).write_text(junit)
        return argparse.Namespace(returncode=code)

    monkeypatch.setattr(lane.subprocess, "run", fake_run)
    assert lane.main(["--out", str(tmp_path), "--workers", "14", "--commit", "c"]) == exit_status
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert ran == ["shared", "alone"] and summary["counts"] == counts and summary["exit_status"] == exit_status
    assert " && " in summary["command"] and str(tmp_path) not in summary["command"]


def test_the_alone_pass_selects_the_tests_that_time_the_gpu():
    import subprocess
    import sys

    root = SCRIPT.parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/gpu",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "gpu_timing",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    selected = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert selected == {
        "tests/gpu/test_emulated_backend_cuda.py",
        "tests/gpu/test_hold_cuda.py",
        "tests/gpu/test_kernels_cuda.py",
    }, proc.stdout


def _shard_summary(k: int, n: int, passed: int, failed: int = 0) -> dict:
    return dict(
        commit="c",
        exit_status=int(bool(failed)),
        wall_s=100.0 + k,
        gpu="NVIDIA H100",
        shard=[k, n],
        torch="2.11.0+cu130",
        transformer_engine="absent",
        counts=dict(passed=passed, failed=failed, errors=0, skipped=1),
        failures=[dict(test=f"t{k}", message="m")] * failed,
        skip_reasons=[dict(reason="needs TE", tests=1)],
        file_seconds={f"tests/test_{k}.py": 1.0},
    )


def test_merging_the_shards_gives_the_whole_lane(lane, tmp_path):
    paths = []
    for k, (passed, failed) in enumerate([(10, 0), (7, 1)], start=1):
        paths.append(tmp_path / f"s{k}.json")
        paths[-1].write_text(json.dumps(_shard_summary(k, 2, passed, failed)))
    code = lane.main(["--merge", *map(str, paths)])
    merged = lane.merge([json.loads(p.read_text()) for p in paths])
    assert code == 1 and merged["exit_status"] == 1
    assert merged["counts"] == dict(passed=17, failed=1, errors=0, skipped=2)
    assert merged["skip_reasons"] == [dict(reason="needs TE", tests=2)] and len(merged["shards"]) == 2
    assert set(merged["file_seconds"]) == {"tests/test_1.py", "tests/test_2.py"} and merged["wall_s"] == 102.0


@pytest.mark.parametrize("shards", [[(1, 2)], [(1, 2), (1, 2)], [(1, 2), (2, 3)]])
def test_a_merge_missing_a_shard_is_refused(lane, shards):
    with pytest.raises(SystemExit, match="every shard"):
        lane.merge([_shard_summary(k, n, 1) for k, n in shards])
