"""The harness's last line for a job a signal stopped names the signal it received and says what the
ranks did, read from what they wrote: a second signal that came after the ranks had saved is not a
kill "before the ranks finished"."""

from __future__ import annotations

import json
import signal

import pytest
from checkpoint_stand_in import saved_checkpoint

from megatron.bridge.perf.stop_report import stop_message
from megatron.bridge.perf.supervisor import JobOutcome

SIGINT, SIGTERM = int(signal.SIGINT), int(signal.SIGTERM)
LAYOUT = dict(tp=1, pp=1, vpp=None, cp=1, ep=2, etp=1, dp=2)

CASES = {
    "stopped-and-saved": (
        dict(final_iteration=3, checkpoint="CKPT/iter_0000003"), JobOutcome(0, SIGINT), True,
        "stopped by SIGINT at iteration 3; checkpoint at CKPT/iter_0000003"),
    "second-signal-after-the-save": (
        dict(final_iteration=3, checkpoint="CKPT/iter_0000003"),
        JobOutcome(-9, SIGINT, killed=True, kill_signal=SIGINT), True,
        "stopped by SIGINT at iteration 3; checkpoint at CKPT/iter_0000003 (the second SIGINT came after the "
        "ranks had saved and written summary.json, and killed them as they exited)"),
    "no-save-asked": (
        dict(final_iteration=3, checkpoint=None), JobOutcome(0, SIGTERM), False,
        "stopped by SIGTERM at iteration 3; no checkpoint (checkpoint.save is not set)"),
    "killed-before-the-ranks-finished": (
        None, JobOutcome(-9, SIGTERM, killed=True, kill_signal=SIGINT), True,
        "killed by the second signal (SIGINT) before the ranks finished; latest checkpoint at CKPT/iter_0000002"),
    "stopped-before-training": (
        None, JobOutcome(0, SIGTERM), False, "stopped by SIGTERM before training started; no checkpoint written"),
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
