"""``<log_dir>/launch.log`` holds everything the ranks print; only the console leaves out the known
third-party noise (``megatron.bridge.utils.quiet``). A stand-in rank (``children/noisy_rank.py``,
logging set up by the entry point's own ``configure_logging``) runs through the harness's real
launch path: the plan ``plan_launch`` builds, run by ``run_plan`` under the supervisor."""

from __future__ import annotations

import dataclasses
import io
import sys
from pathlib import Path

import pytest

from megatron.bridge.perf.harness.launcher import plan_launch, run_plan
from megatron.bridge.perf.harness.supervisor import LAUNCH_LOG

CHILD = Path(__file__).with_name("children") / "noisy_rank.py"

NOISE = [
    "UserWarning: Apex is not installed. Falling back to Torch Norm",
    'warnings.warn("Apex is not installed. Falling back to Torch Norm", UserWarning)',
    "INFO megatron.core.distributed.param_and_grad_buffer: Number of buckets: 1",
    "Params for bucket 1 (2 elements):",
    "\tmodule.weight",
    "GPTModel IS DEPRECATED",
    "No CUDA runtime is found",
]
"""What the quiet mode drops: the console leaves it out, the log keeps it."""
SHOWN = [
    "[megatron.bridge] launch: stand-in rank",
    "UserWarning: an unknown warning the user must see",
    "WARNING megatron.core.optimizer: a megatron-core warning the user must see",
    "iteration      1/1 | loss 1.0",
]
"""What the console shows in either mode."""


def _run(tmp_path: Path, verbose: bool) -> tuple[str, str]:
    plan = plan_launch(
        cpu=True,
        num_gpus=1,
        gpus_per_node=1,
        procs_per_gpu=1,
        config_path=tmp_path / "config.yaml",
        log_dir=tmp_path,
        environ={},
        verbose=verbose,
    )
    worker_flags = ["--verbose"] if "--verbose" in plan.argv else []  # what the plan passes the entry point
    out = io.StringIO()
    outcome = run_plan(
        dataclasses.replace(plan, argv=[sys.executable, str(CHILD), *worker_flags]), stream=out, verbose=verbose
    )
    assert outcome.exit_code == 0, out.getvalue()
    return out.getvalue(), (tmp_path / LAUNCH_LOG).read_text()


@pytest.mark.parametrize("verbose", [False, True], ids=["console-quiet", "verbose"])
def test_launch_log_holds_all_rank_output_and_only_the_console_is_filtered(tmp_path, verbose):
    console, log = _run(tmp_path, verbose)
    for text in NOISE + SHOWN:
        assert text in log, (text, log)
    for text in SHOWN:
        assert text in console, (text, console)
    for text in NOISE:
        assert (text in console) is verbose, (text, console)
    assert "[quiet]" not in log and "[quiet]" not in console  # the mark is the harness's, not output


def test_the_printed_command_prints_what_the_console_shows(tmp_path):
    """The launch command the harness prints leaves the marking out: copied into a shell, the
    ranks drop the noise themselves, as the console does."""
    plan = plan_launch(
        cpu=True,
        num_gpus=2,
        gpus_per_node=2,
        procs_per_gpu=1,
        config_path=tmp_path / "c.yaml",
        log_dir=tmp_path,
        environ={},
    )
    assert plan.supervised_env and not set(plan.supervised_env) & set(plan.env)
    assert not any(key in plan.shell() for key in plan.supervised_env)


@pytest.mark.parametrize(
    "verbose, shown",
    [
        (False, ["--- rank 0: last lines of rank log ---", "ValueError: bad"]),
        (True, ["--- rank 0: last lines of rank log ---", "[rank 0] INFO megatron.core.x: dump", "ValueError: bad"]),
    ],
    ids=["quiet", "verbose"],
)
def test_failure_report_quotes_rank_logs_as_the_console_shows_them(verbose, shown):
    """The per-rank logs under ``torchrun/`` hold the marked lines; the failure report that quotes
    their tail leaves them out like the console (and shows them unmarked with ``-v``)."""
    from megatron.bridge.perf.harness.execution import console_text
    from megatron.bridge.utils.quiet import QUIET_MARK

    report = "\n".join(
        [
            "--- rank 0: last lines of rank log ---",
            QUIET_MARK + "[rank 0] INFO megatron.core.x: dump",
            "ValueError: bad",
        ]
    )
    assert console_text(report, verbose).splitlines() == shown
