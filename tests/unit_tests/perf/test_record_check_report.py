"""A GPU check's record keeps its last REPORT line with the command, setting and code; a log without
one is refused with a message, and no record is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from perf_scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("record_check_report.py")


def _argv(log: Path, out: Path) -> list[str]:
    return [
        "--log",
        str(log),
        "--out",
        str(out),
        "--command",
        "torchrun x.py",
        "--setting",
        "one GPU",
        "--tree",
        "abc1234",
    ]


def test_the_last_report_line_is_recorded_with_its_context(script, tmp_path) -> None:
    log = tmp_path / "run.log"
    log.write_text('noise\nREPORT {"a": 1}\nwarning\nREPORT {"a": 2, "b": [0, 0]}\nrc=0\n')
    out = tmp_path / "records" / "r.json"
    assert script.main(_argv(log, out)) == 0
    assert json.loads(out.read_text()) == {
        "command": "torchrun x.py",
        "setting": "one GPU",
        "tree": "abc1234",
        "report": {"a": 2, "b": [0, 0]},
    }


def test_a_log_without_a_report_is_refused_and_nothing_is_written(script, tmp_path, capsys) -> None:
    log = tmp_path / "run.log"
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    out = tmp_path / "r.json"
    assert script.main(_argv(log, out)) == 2
    assert not out.exists() and "no line starting with 'REPORT '" in capsys.readouterr().err
