"""A rank reports a stop under the signal that asked for it: its own, or, when the harness relayed a
stop as SIGTERM, the one the harness received (its note, named by ``STOP_NOTE_ENV``). The signals are
sent to this test process with the handler installed, as they reach a rank."""

from __future__ import annotations

import os
import signal

import pytest

from megatron.bridge.training.loop.stop_request import STOP_NOTE_ENV, STOP_SIGNAL_NAMES, StopRequest


@pytest.fixture
def request_installed():
    stop = StopRequest()
    assert stop.install()
    yield stop
    stop.uninstall()


@pytest.mark.parametrize(
    "note, received, reported",
    [
        ("SIGINT", signal.SIGTERM, "SIGINT"),  # Ctrl-C to the harness, relayed as SIGTERM
        ("SIGHUP", signal.SIGTERM, "SIGHUP"),  # the harness's terminal closed
        ("SIGTERM", signal.SIGTERM, "SIGTERM"),
        (None, signal.SIGTERM, "SIGTERM"),  # no harness: SLURM, torchrun, a user's kill
        ("SIGKILL", signal.SIGTERM, "SIGTERM"),  # not a stop signal: the note is not believed
        ("nonsense", signal.SIGTERM, "SIGTERM"),
        ("SIGHUP", signal.SIGINT, "SIGINT"),  # only a relayed SIGTERM reads the note
    ],
    ids=["ctrl-c", "hangup", "sigterm", "no-note", "not-a-stop-signal", "unreadable", "own-sigint"],
)
def test_a_stop_is_reported_under_the_signal_that_asked_for_it(
    request_installed, tmp_path, monkeypatch, note, received, reported
):
    path = tmp_path / "stop_signal"
    if note is not None:
        path.write_text(note)
    monkeypatch.setenv(STOP_NOTE_ENV, str(path))
    os.kill(os.getpid(), received)
    assert request_installed.name == reported and reported in STOP_SIGNAL_NAMES


def test_the_first_signal_is_kept(request_installed, tmp_path, monkeypatch):
    path = tmp_path / "stop_signal"
    path.write_text("SIGINT")
    monkeypatch.setenv(STOP_NOTE_ENV, str(path))
    os.kill(os.getpid(), signal.SIGTERM)
    path.write_text("SIGHUP")
    os.kill(os.getpid(), signal.SIGTERM)
    assert request_installed.name == "SIGINT"
