"""One run per checkpoint directory: the lock a run holds in ``checkpoint.save``, what a second run
is told, and when a lock left behind is taken over."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron.bridge.perf.harness.run import main
from megatron.bridge.training.config_stages.facts.lock_holder import LOCK_NAME, STALE_AFTER_S, read_holder
from megatron.bridge.training.loop.save_lock import SaveDirInUseError, SaveDirLock

TAKER = Path(__file__).parent / "children" / "take_save_lock.py"


@pytest.fixture
def live_holder(tmp_path):
    """Another live run holding ``tmp_path/ck`` (its pid)."""
    go, result = tmp_path / "go_holder", tmp_path / "holder_result"
    go.touch()
    proc = subprocess.Popen([sys.executable, str(TAKER), str(tmp_path / "ck"), str(go), str(result), "120"])
    deadline = time.monotonic() + 60
    while not result.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert result.read_text() == "took"
    yield proc.pid
    proc.kill()
    proc.wait()


def _plant(save_dir, pid, host=None, age_s=0.0):
    save_dir.mkdir(parents=True, exist_ok=True)
    path = save_dir / LOCK_NAME
    path.write_text(
        json.dumps(dict(host=host or socket.gethostname(), pid=pid, started=time.time() - age_s, run_id="other"))
    )
    os.utime(path, (time.time() - age_s, time.time() - age_s))


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_run_is_refused_naming_the_holder(tmp_path):
    first = SaveDirLock(tmp_path / "ck").acquire()
    with pytest.raises(SaveDirInUseError, match=rf"host {socket.gethostname()}, pid {os.getpid()}, started"):
        SaveDirLock(tmp_path / "ck").acquire()
    first.release()
    assert not (tmp_path / "ck" / LOCK_NAME).exists()
    SaveDirLock(tmp_path / "ck").acquire().release()  # free again once released


@pytest.mark.parametrize(
    "holder, taken_over",
    [
        (lambda: dict(pid=_gone_pid()), True),  # this host, process gone
        (lambda: dict(pid=1, host="elsewhere", age_s=STALE_AFTER_S + 60), True),  # another host, not refreshed
        (lambda: dict(pid=1, host="elsewhere", age_s=5), False),  # another host, refreshed a moment ago
    ],
)
def test_a_lock_whose_holder_is_gone_is_taken_over_with_a_note(tmp_path, holder, taken_over):
    _plant(tmp_path / "ck", **holder())
    lock = SaveDirLock(tmp_path / "ck")
    if not taken_over:
        with pytest.raises(SaveDirInUseError, match="host elsewhere"):
            lock.acquire()
        return
    lock.acquire()
    assert "took over" in lock.note and read_holder(tmp_path / "ck").run_id == lock.run_id


def test_the_harness_refuses_a_save_directory_another_live_run_holds(tmp_path, live_holder):
    out = io.StringIO()
    code = main(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "cpu",
            "-ng",
            "2",
            "-ep",
            "2",
            "-l",
            str(tmp_path / "run"),
            f"checkpoint.save={tmp_path / 'ck'}",
            "--dryrun",
        ],
        out=out,
    )
    text = out.getvalue()
    assert code == 2 and "checkpoint-save-not-in-use" in text and f"pid {live_holder}" in text
    assert "nothing was launched" in text


def _race(save_dir: Path, trial: int, tmp_path: Path) -> list[str]:
    """Two processes take ``save_dir``'s lock at the same moment; what each got."""
    go = tmp_path / f"go{trial}"
    results = [tmp_path / f"trial{trial}_{i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(TAKER), str(save_dir), str(go), str(r)]) for r in results]
    time.sleep(0.8)  # both are importing and then waiting for the start file
    go.touch()
    for proc in procs:
        proc.wait(timeout=60)
    return sorted(r.read_text() for r in results)


@pytest.mark.parametrize("left_behind", ["nothing", "a lock of a gone process", "an empty lock file"])
def test_two_runs_starting_at_once_get_the_lock_once(tmp_path, left_behind):
    """Taking a free lock and taking over a stale one are atomic: of two runs released together,
    exactly one holds the directory, every time (the content check let both in before)."""
    save_dir = tmp_path / "ck"
    for trial in range(8):
        if left_behind == "a lock of a gone process":
            _plant(save_dir, _gone_pid())
        elif left_behind == "an empty lock file":
            save_dir.mkdir(exist_ok=True)
            (save_dir / LOCK_NAME).write_text("")
        assert _race(save_dir, trial, tmp_path) == ["refused", "took"], f"trial {trial}"
        (save_dir / LOCK_NAME).unlink(missing_ok=True)


def test_a_run_lock_that_is_a_directory_is_refused_before_launch(tmp_path):
    (tmp_path / "ck" / LOCK_NAME).mkdir(parents=True)
    out = io.StringIO()
    code = main(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "cpu",
            "-ng",
            "2",
            "-ep",
            "2",
            "-l",
            str(tmp_path / "run"),
            f"checkpoint.save={tmp_path / 'ck'}",
            "--dryrun",
        ],
        out=out,
    )
    assert code == 2 and "checkpoint-save-lock-usable" in out.getvalue() and "not a regular file" in out.getvalue()
