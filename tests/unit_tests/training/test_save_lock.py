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

import pytest

from megatron.bridge.perf.run import main
from megatron.bridge.training.loop.save_lock import LOCK_NAME, STALE_AFTER_S, SaveDirInUseError, SaveDirLock, read_holder


@pytest.fixture
def live_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _plant(save_dir, pid, host=None, age_s=0.0):
    save_dir.mkdir(parents=True, exist_ok=True)
    path = save_dir / LOCK_NAME
    path.write_text(json.dumps(dict(host=host or socket.gethostname(), pid=pid, started=time.time() - age_s,
                                    run_id="other")))
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


def test_the_harness_refuses_a_save_directory_another_live_run_holds(tmp_path, live_process):
    _plant(tmp_path / "ck", live_process)
    out = io.StringIO()
    code = main(["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "-l", str(tmp_path / "run"),
                 f"checkpoint.save={tmp_path / 'ck'}", "--dryrun"], out=out)
    text = out.getvalue()
    assert code == 2 and "checkpoint-save-not-in-use" in text and f"pid {live_process}" in text
    assert "nothing was launched" in text
