"""The code A/B: two checkouts of the emulation benchmark interleaved in one call, compared repeat by
repeat, and its arguments refused with their fixes before anything runs."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from perf_scripts import load_script

from megatron.bridge.perf.benchmarks import code_ab

FAKE_BENCHMARK = Path(__file__).parent / "children" / "fake_emulation_benchmark.py"


def _checkout(root: Path, step: float) -> Path:
    """A checkout whose benchmark is the stand-in: every step it reports is ``step`` (off) or 0.9x (on)."""
    (root / code_ab.PACKAGE).mkdir(parents=True)
    (root / code_ab.BENCHMARK).parent.mkdir(parents=True)
    shutil.copy(FAKE_BENCHMARK, root / code_ab.BENCHMARK)
    (root / "step.txt").write_text(str(step))
    return root


@pytest.mark.parametrize(
    "repeats, expected",
    [
        (2, [(1, "A"), (1, "B"), (2, "B"), (2, "A")]),
        (3, [(1, "A"), (1, "B"), (2, "B"), (2, "A"), (3, "A"), (3, "B")]),
    ],
)
def test_neither_code_always_runs_first(repeats, expected):
    assert code_ab.interleaved_order(("A", "B"), repeats) == expected


def test_the_ratio_is_taken_repeat_by_repeat_and_only_where_both_ran():
    def row(arm, step):
        return {"network": "h100_ib400", "dispatcher": "alltoall", "arm": arm, "step_s": [step]}

    runs = {
        (1, "A"): [row("off", 1.0), row("on", 2.0)],
        (1, "B"): [row("off", 0.9), row("on", 2.2)],
        (2, "B"): [row("off", 1.6)],
        (2, "A"): [row("off", 2.0)],
    }
    off, on = code_ab.same_run_ratios(runs, ("A", "B"))
    assert off["B_over_A"] == pytest.approx([0.9, 0.8]) and off["B_faster_every_repeat"]
    assert on["B_over_A"] == pytest.approx([1.1]) and not on["B_faster_every_repeat"]
    assert on["A_step_s"] == [2.0] and off["B_over_A_mean"] == pytest.approx(0.85)


def test_two_checkouts_run_interleaved_and_the_result_says_which_is_faster(tmp_path):
    a, b = _checkout(tmp_path / "a", 2.0), _checkout(tmp_path / "b", 1.5)
    out = tmp_path / "out"
    argv = ["--root", str(a), "--other-root", str(b), "--other-label", "gather", "--out", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert load_script("ep_code_ab.py").main([*argv, "--", "--arms", "off,on"]) == 0
    record = json.loads((out / "ab.json").read_text())
    assert (out / "order.log").read_text().splitlines() == [
        f"{name} repeats=1 src_first=True" for name in ("A_r1", "gather_r1", "gather_r2", "A_r2")
    ]
    assert record["order"] == ["A_r1", "gather_r1", "gather_r2", "A_r2"] and record["host"] == {"cpu": "Example"}
    assert [row["gather_over_A"] for row in record["rows"]] == [pytest.approx([0.75, 0.75])] * 2
    assert all(row["gather_faster_every_repeat"] for row in record["rows"])
    assert str(tmp_path) not in record["command"] and "| 4 | off | 2.000, 2.000 | 1.500, 1.500 |" in printed.getvalue()


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--repeats", "1"], "--repeats 1: an A/B needs at least 2"),
        (["--other-label", "A"], "the two codes need different labels"),
        (["--other-label", "a/b"], "label 'a/b': use letters, digits"),
        (["--", "--out", "x"], "--out after '--': the A/B sets it"),
        (["--", "--publish"], "--publish after '--'"),
    ],
)
def test_bad_arguments_are_refused_all_at_once_before_anything_runs(extra, says, tmp_path, capsys):
    a = _checkout(tmp_path / "a", 1.0)
    argv = ["--root", str(a), "--other-root", str(tmp_path / "missing"), "--out", str(tmp_path / "out"), *extra]
    with pytest.raises(SystemExit) as stopped:
        load_script("ep_code_ab.py").main(argv)
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and says in error and "missing holds no" in error
    assert not (tmp_path / "out").exists()
