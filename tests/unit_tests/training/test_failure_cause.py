"""A rank's failure with its cause: what the failure record says, and the report that reads it."""

from __future__ import annotations

import errno
import json
from collections import namedtuple

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from megatron.bridge.perf.harness.failure_report import failure_report
from megatron.bridge.training import entry
from megatron.bridge.training.loop import failure_cause
from megatron.bridge.training.loop.failure_cause import describe_failure


def _raised(exc):
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - the point: every class
        return caught


def _truncated_shard() -> CheckpointException:
    inner = _raised(EOFError("Ran out of input: checkpoint file is corrupted"))
    return CheckpointException("load failed", {1: (inner, None)})


def _peer_lost() -> RuntimeError:
    try:
        try:
            raise ConnectionError("Connection closed by peer")
        except ConnectionError as cause:
            raise RuntimeError("MockGPTDataset failed to build") from cause
    except RuntimeError as exc:
        return exc


def test_a_checkpoint_exception_is_described_with_the_ranks_own_error():
    text = describe_failure(_truncated_shard())
    assert text.startswith("CheckpointException") and "checkpoint file is corrupted" in text


def test_the_entry_point_records_a_base_exception_and_the_report_blames_the_rank_with_the_cause(tmp_path, monkeypatch):
    """Rank 1 fails on the corrupted shard (a BaseException); rank 0 fails after it on a lost peer,
    slightly earlier by the clock. The report leads with rank 1 and its real cause."""
    for rank, exc in ((0, _peer_lost()), (1, _truncated_shard())):
        monkeypatch.setenv("RANK", str(rank))
        entry.write_failure_record(tmp_path, exc)
    record = json.loads((tmp_path / "failures" / "rank_00001.json").read_text())
    assert "checkpoint file is corrupted" in record["error"]
    first = failure_report(tmp_path, 1).splitlines()[0]
    assert "rank 1 failed first" in first and "corrupted" in first


Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize(
    "exc, free, full",
    [
        (OSError(errno.ENOSPC, "No space left on device"), 10 * 2**30, True),
        (RuntimeError("unexpected pos 704 vs 598"), 0, True),  # megatron's writer kept only this
        (RuntimeError("unexpected pos 704 vs 598"), 10 * 2**30, False),
        (ValueError("NaN in the gradients"), 0, False),  # not an I/O failure: the disk is not blamed
    ],
)
def test_a_full_disk_is_said_in_those_words_with_the_path(tmp_path, monkeypatch, exc, free, full):
    monkeypatch.setattr(failure_cause.shutil, "disk_usage", lambda path: Usage(1, 1, free))
    text = describe_failure(_raised(exc), save_dir=str(tmp_path / "ckpt"))
    assert text.startswith(f"No space left on device on {tmp_path / 'ckpt'}") == full
