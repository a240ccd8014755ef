"""The harness's last line for a job a signal stopped names the signal it received and says what the
ranks did, read from what they wrote: a second signal that came after the ranks had saved is not a
kill "before the ranks finished". What a second signal says of the checkpoint directory when it
kills the ranks before they finished (``saved_state``) is read from the directory too."""

from __future__ import annotations

import json
import signal

import pytest
from checkpoint_stand_in import saved_checkpoint

from megatron.bridge.perf.harness.stop_report import stop_message
from megatron.bridge.perf.harness.supervisor import JobOutcome, saved_state

SIGINT, SIGTERM = int(signal.SIGINT), int(signal.SIGTERM)
LAYOUT = dict(tp=1, pp=1, vpp=None, cp=1, ep=2, etp=1, dp=2)

CASES = {
    "stopped-and-saved": (
        dict(final_iteration=3, checkpoint="CKPT/iter_0000003"),
        JobOutcome(0, SIGINT),
        True,
        "stopped by SIGINT at iteration 3; checkpoint at CKPT/iter_0000003",
    ),
    "second-signal-after-the-save": (
        dict(final_iteration=3, checkpoint="CKPT/iter_0000003"),
        JobOutcome(-9, SIGINT, killed=True, kill_signal=SIGINT),
        True,
        "stopped by SIGINT at iteration 3; checkpoint at CKPT/iter_0000003 (the second SIGINT came after the "
        "ranks had saved and written summary.json, and killed them as they exited)",
    ),
    "no-save-asked": (
        dict(final_iteration=3, checkpoint=None),
        JobOutcome(0, SIGTERM),
        False,
        "stopped by SIGTERM at iteration 3; no checkpoint (checkpoint.save is not set)",
    ),
    "killed-before-the-ranks-finished": (
        None,
        JobOutcome(-9, SIGTERM, killed=True, kill_signal=SIGINT),
        True,
        "killed by the second signal (SIGINT) before the ranks finished; latest checkpoint at CKPT/iter_0000002",
    ),
    "stopped-before-training": (
        None,
        JobOutcome(0, SIGTERM),
        False,
        "stopped by SIGTERM before training started; no checkpoint written",
    ),
}
"""case -> (summary.json or None, outcome, a checkpoint directory holding iteration 2, the line)."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_stop_line_names_the_signal_and_what_the_ranks_did(case, tmp_path):
    summary, outcome, with_checkpoint, expected = CASES[case]
    ckpt = tmp_path / "ckpt"
    if with_checkpoint:
        saved_checkpoint(ckpt, 2, LAYOUT)
    summary_path = tmp_path / "summary.json"
    if summary is not None:
        summary_path.write_text(json.dumps(summary).replace("CKPT", str(ckpt)))
    line = stop_message(summary_path, outcome, str(ckpt) if with_checkpoint else None)
    assert line == expected.replace("CKPT", str(ckpt)), line


SAVED_STATES = {
    "no-save-asked": (None, None, (), "checkpoint.save is not set: nothing was to be saved"),
    "nothing-yet": (True, None, (), "no checkpoint is complete"),
    "complete": (True, 2, (), "the latest complete checkpoint is CKPT/iter_0000002"),
    "save-under-way": (
        True,
        2,
        (3,),
        "the save of iteration 3 under way is not kept; the latest complete checkpoint is CKPT/iter_0000002",
    ),
    "first-save-under-way": (
        True,
        None,
        (1,),
        "the save of iteration 1 under way is not kept; no checkpoint is complete",
    ),
    "older-leftover": (True, 2, (1,), "the latest complete checkpoint is CKPT/iter_0000002"),
}
"""case -> (checkpoint.save given, its complete iteration, staged iterations, what is said)."""


@pytest.mark.parametrize("case", sorted(SAVED_STATES))
def test_a_kill_before_the_ranks_finished_says_what_the_checkpoint_directory_holds(case, tmp_path):
    given, complete, staged, expected = SAVED_STATES[case]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    if complete is not None:
        saved_checkpoint(ckpt, complete, LAYOUT)
    for iteration in staged:
        (ckpt / f"iter_{iteration:07d}.incomplete.run1").mkdir()
    assert saved_state(str(ckpt) if given else None) == expected.replace("CKPT", str(ckpt))
