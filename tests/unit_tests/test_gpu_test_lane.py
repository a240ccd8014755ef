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
