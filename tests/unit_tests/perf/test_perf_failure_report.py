"""The failure report leads with the rank that failed first, whatever the others printed after it."""

from __future__ import annotations

import json

import pytest

from megatron.bridge.perf.harness.failure_report import failed_ranks, failure_report

PEER_LOST = "RuntimeError: [gloo/transport/tcp/pair.cc:545] Read error: Connection reset by peer"


def torchrun_summary(*failures: tuple[int, int, int]) -> list[str]:
    """torchrun's ChildFailedError block for (rank, exit code, pid) failures."""
    lines = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 40, "Failures:"]
    for i, (rank, code, pid) in enumerate(failures):
        lines += [
            f"[{i}]:",
            "  time      : 2026-12-01_00:39:59",
            "  host      : node1",
            f"  rank      : {rank} (local_rank: {rank})",
            f"  exitcode  : {code} (pid: {pid})",
        ]
    return lines + ["=" * 40]


def closing(pid: int) -> str:
    return (
        f"W1201 00:39:58.927000 10545 torch/distributed/elastic/multiprocessing/api.py:1028] "
        f"Sending process {pid} closing signal SIGTERM"
    )


# case -> (rank failure records {rank: (time, error, pid)}, launcher lines, expected order of ranks)
CASES = {
    "killed rank before the rank that lost it": (
        {0: (10.5, PEER_LOST, 100)},
        torchrun_summary((0, 1, 100), (1, -9, 101)),
        [1, 0],
    ),
    "own error before the peers that lost it": (
        {
            2: (5.0, "torch.OutOfMemoryError: CUDA out of memory", 102),
            0: (5.1, PEER_LOST, 100),
            1: (5.2, PEER_LOST, 101),
        },
        torchrun_summary((0, 1, 100), (1, 1, 101), (2, 1, 102)),
        [2, 0, 1],
    ),
    "ranks the launcher stopped come after the failure": (
        {1: (3.0, "ValueError: bad batch", 101)},
        [closing(100), *torchrun_summary((0, -9, 100), (1, 1, 101))],
        [1, 0],
    ),
    "same error everywhere: the earliest first": (
        {0: (7.2, "FileNotFoundError: /data/x.bin", 100), 1: (7.1, "FileNotFoundError: /data/x.bin", 101)},
        torchrun_summary((0, 1, 100), (1, 1, 101)),
        [1, 0],
    ),
    "srun names the killed task": (
        {0: (4.0, PEER_LOST, 100), 2: (4.1, PEER_LOST, 102)},
        ["srun: error: node7: task 3: Killed", "srun: error: node7: tasks 0,2: Exited with exit code 1"],
        [3, 0, 2],
    ),
}


def _write_records(log_dir, records):
    (log_dir / "failures").mkdir()
    for rank, (time, error, pid) in records.items():
        (log_dir / "failures" / f"rank_{rank:05d}.json").write_text(
            json.dumps({"rank": rank, "time": time, "error": error, "pid": pid})
        )


@pytest.mark.parametrize("case", sorted(CASES))
def test_first_failing_rank_leads(tmp_path, case):
    records, lines, order = CASES[case]
    _write_records(tmp_path, records)
    assert [f.rank for f in failed_ranks(tmp_path, lines)] == order


def test_report_names_the_first_rank_its_exit_code_and_its_log_tail(tmp_path):
    records, lines, _ = CASES["killed rank before the rank that lost it"]
    _write_records(tmp_path, records)
    rank_dir = tmp_path / "torchrun" / "run_1" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stdout.log").write_text("iteration 1\niteration 2\n")
    report = failure_report(tmp_path, 1, lines)
    first, *rest = report.splitlines()
    assert first == "job failed with exit code 1: rank 1 failed first (exit code -9 (killed by SIGKILL))"
    assert "iteration 2" in report
    assert any(line.startswith("rank 0: then lost its peer (exit code 1: RuntimeError") for line in rest)
