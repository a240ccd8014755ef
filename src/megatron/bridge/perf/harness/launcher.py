"""Launch-command construction and execution for the harness.

Modes, chosen by :func:`choose_mode`:

* ``cpu``      - ``-g cpu``: ``-ng`` local processes over gloo through ``torchrun`` (CPU smoke mode);
* ``srun``     - inside a SLURM allocation (``SLURM_JOB_ID`` set): one task per rank;
* ``sbatch``   - more GPUs than one node holds, outside an allocation: an ``sbatch`` script is written
  into the log directory and the command to submit it is printed;
* ``torchrun`` - everything else: one node, one process per GPU (per rank with ``--procs_per_gpu``).

Workers run ``python -m megatron.bridge.training.entry --config-file <log_dir>/config.yaml``.
Their environment (``CUDA_DEVICE_MAX_CONNECTIONS`` and friends) is set in the launcher's child
environment, i.e. before any worker initialises CUDA. ``torchrun`` tears the whole job down when one
rank fails; the harness then returns that non-zero exit code and prints the tail of the rank that
failed first (``--redirects 3 --tee 3`` keeps a per-rank copy under ``<log_dir>/torchrun``).

Stopping: SIGTERM/SIGINT to the harness reach the ranks as SIGTERM, which they report under the
signal the harness received (``supervisor``'s stop note); a batch
script asks SLURM for SIGTERM ``SLURM_STOP_LEAD_S`` seconds before its time limit
(``--signal=B:TERM@...``) and forwards it to ``srun``, which forwards it to every task. The ranks
finish their step, save once and exit 0.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

from megatron.bridge.perf.harness.supervisor import JobOutcome, StopTarget, supervise
from megatron.bridge.training.harness_surface import HARNESS_REPORTS_ENV
from megatron.bridge.utils.quiet import MARK_ENV

ENTRY_MODULE = "megatron.bridge.training.entry"
LOOPBACK_TORCHRUN_MODULE = "megatron.bridge.perf.loopback_torchrun"
LOOPBACK_BACKEND = "loopback"
LOOPBACK = "127.0.0.1"
CONFIG_NAME = "config.yaml"
TORCHRUN_DIR = "torchrun"
SBATCH_NAME = "launch.sbatch"
SLURM_STOP_LEAD_S = 120
"""Seconds before the time limit at which SLURM sends the batch script SIGTERM: the ranks' time to
finish the step and write a checkpoint before SLURM kills the job."""
LaunchMode = Literal["torchrun", "srun", "sbatch", "cpu"]


@dataclass
class LaunchPlan:
    """What the harness will run, and in which environment."""

    mode: LaunchMode
    argv: list[str]
    env: dict[str, str]
    nprocs: int
    nodes: int
    log_dir: Path
    script_path: Path | None = None
    script_text: str | None = None
    notes: list[str] = field(default_factory=list)
    save_dir: str | None = None
    """The job's ``checkpoint.save``: what a second stop signal says it interrupts is read from it."""
    supervised_env: dict[str, str] = field(default_factory=dict)
    """Added to ``env`` only when the harness runs the plan itself (not in :meth:`shell`): the
    ranks then print their known third-party noise marked instead of dropping it, so that
    ``launch.log`` holds everything and the console leaves the marked lines out, and leave the
    Results table to the harness. A command copied from :meth:`shell` prints what the console shows
    (and its own Results table)."""

    def shell(self) -> str:
        """Copy-pasteable command line (environment first)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env and self.mode != "sbatch" else "") + shlex.join(self.argv)


def worker_argv(config_path: Path, python: str, verbose: bool = False, config_sha256: str | None = None) -> list[str]:
    """The per-rank command (the training entry point on the resolved YAML; with its digest, the
    ranks load only the file the harness wrote)."""
    digest = ["--config-sha256", config_sha256] if config_sha256 else []
    return [python, "-m", ENTRY_MODULE, "--config-file", str(config_path), *digest, *(["--verbose"] if verbose else [])]


def choose_mode(*, cpu: bool, num_gpus: int, gpus_per_node: int, environ: Mapping[str, str]) -> LaunchMode:
    """CPU mode, then SLURM allocation, then multi-node (sbatch), else local torchrun."""
    if cpu:
        return "cpu"
    if environ.get("SLURM_JOB_ID"):
        return "srun"
    if num_gpus > gpus_per_node:
        return "sbatch"
    return "torchrun"


def worker_env(
    *, cpu: bool, cuda_device_max_connections: int | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment the workers need before CUDA starts."""
    env = {"PYTHONUNBUFFERED": "1"}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the smoke mode must not touch a GPU even where one exists
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
        env["GLOO_SOCKET_IFNAME"] = "lo"  # one machine: the ranks' connections stay on loopback
    else:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3"  # a failed collective aborts instead of hanging
        if cuda_device_max_connections is not None:
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(cuda_device_max_connections)
    env.update(extra or {})
    return env


def torchrun_argv(nprocs: int, log_dir: Path, worker: Sequence[str], python: str) -> list[str]:
    """Single-node ``torchrun`` with per-rank logs and no restarts (a failure ends the job), its
    rendezvous served on loopback only (``loopback_torchrun``)."""
    return [
        python,
        "-m",
        LOOPBACK_TORCHRUN_MODULE,
        "--nnodes=1",
        f"--nproc-per-node={nprocs}",
        f"--rdzv-backend={LOOPBACK_BACKEND}",
        f"--rdzv-endpoint={LOOPBACK}:0",
        "--max-restarts=0",
        f"--log-dir={log_dir / TORCHRUN_DIR}",
        "--redirects=3",
        "--tee=3",
        *worker[1:],  # torchrun runs "-m module args" with its own interpreter
    ]


def srun_argv(nprocs: int, nodes: int, tasks_per_node: int, worker: Sequence[str]) -> list[str]:
    """``srun`` inside an allocation: one task per rank, the job dies with its first failing task."""
    return [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nprocs}",
        f"--ntasks-per-node={tasks_per_node}",
        "--kill-on-bad-exit=1",
        "--label",
        "--export=ALL",
        *worker,
    ]


def sbatch_script(
    *,
    nodes: int,
    gpus_per_node: int,
    tasks_per_node: int,
    log_dir: Path,
    worker: Sequence[str],
    env: Mapping[str, str],
    job_name: str,
    account: str | None,
    partition: str | None,
    time_limit: str | None,
    workdir: Path,
) -> str:
    """A self-contained batch script: one task per rank, MASTER_ADDR from the allocation."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={tasks_per_node}",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        f'#SBATCH --output="{log_dir}/slurm-%j.out"',  # quoted: a path may hold spaces
        "#SBATCH --exclusive",
    ]
    lines += [f"#SBATCH --account={account}"] if account else []
    lines += [f"#SBATCH --partition={partition}"] if partition else []
    lines += [f"#SBATCH --time={time_limit}"] if time_limit else []
    lines += [f"#SBATCH --signal=B:TERM@{SLURM_STOP_LEAD_S}"]
    lines += ["", "set -euo pipefail", f"cd {shlex.quote(str(workdir))}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines += [
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        'export MASTER_PORT="${MASTER_PORT:-29500}"',
        *_srun_with_stop_forwarding(f"srun --kill-on-bad-exit=1 --label --export=ALL {shlex.join(worker)}"),
        "",
    ]
    return "\n".join(lines)


def _srun_with_stop_forwarding(srun_command: str) -> list[str]:
    """Run ``srun`` in the background so that the script can forward SIGTERM (SLURM's pre-timeout
    signal, ``scancel --signal=TERM --batch``) and SIGINT to it, then wait until it has ended."""
    return [
        f"{srun_command} &",
        "srun_pid=$!",
        "forward_stop() {",
        '    echo "batch script: stop signal received, forwarding SIGTERM to srun (the ranks save and exit)"',
        '    kill -TERM "$srun_pid" 2>/dev/null || true',
        "}",
        "trap forward_stop TERM INT",
        "status=0",
        "# wait returns early when a signal arrives; wait again until srun has really ended",
        'while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid" && status=0 || status=$?; done',
        'exit "$status"',
    ]


def plan_launch(
    *,
    cpu: bool,
    num_gpus: int,
    gpus_per_node: int,
    procs_per_gpu: int,
    config_path: Path,
    log_dir: Path,
    cuda_device_max_connections: int | None = None,
    extra_env: Mapping[str, str] | None = None,
    account: str | None = None,
    partition: str | None = None,
    time_limit: str | None = None,
    job_name: str = "moe-overlap",
    environ: Mapping[str, str] | None = None,
    python: str | None = None,
    workdir: Path | None = None,
    verbose: bool = False,
    config_sha256: str | None = None,
    save_dir: str | None = None,
) -> LaunchPlan:
    """Build (do not run) the launch for a job of ``num_gpus`` GPUs (processes in CPU mode)."""
    environ = os.environ if environ is None else environ
    python = python or sys.executable
    mode = choose_mode(cpu=cpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node, environ=environ)
    nodes = 1 if cpu else -(-num_gpus // gpus_per_node)
    per_node_gpus = num_gpus if cpu else min(num_gpus, gpus_per_node)
    tasks_per_node = per_node_gpus * (1 if cpu else procs_per_gpu)
    nprocs = num_gpus * (1 if cpu else procs_per_gpu)
    env = worker_env(cpu=cpu, cuda_device_max_connections=cuda_device_max_connections, extra=extra_env)
    worker = worker_argv(config_path, python, verbose, config_sha256)
    plan = LaunchPlan(mode, [], env, nprocs, nodes, log_dir, save_dir=save_dir)
    if mode != "sbatch":  # the harness watches the job and prints its Results table itself
        plan.supervised_env[HARNESS_REPORTS_ENV] = "1"
    if mode != "sbatch" and not verbose:  # an sbatch job's output goes to SLURM's file, unfiltered by the harness
        plan.supervised_env[MARK_ENV] = "1"
    if mode in ("cpu", "torchrun"):
        plan.argv = torchrun_argv(nprocs, log_dir, worker, python)
    elif mode == "srun":
        plan.argv = srun_argv(nprocs, nodes, tasks_per_node, worker)
    else:
        plan.script_path = log_dir / SBATCH_NAME
        plan.script_text = sbatch_script(
            nodes=nodes,
            gpus_per_node=per_node_gpus,
            tasks_per_node=tasks_per_node,
            log_dir=log_dir,
            worker=worker,
            env=env,
            job_name=job_name,
            account=account,
            partition=partition,
            time_limit=time_limit,
            workdir=workdir or Path.cwd(),
        )
        plan.argv = ["sbatch", str(plan.script_path)]
        if not account or not partition:
            plan.notes.append("no --account/--partition given: the cluster's defaults apply")
    return plan


# --------------------------------------------------------------------------------------------- running
def stop_target(plan: LaunchPlan) -> StopTarget:
    """Who gets a stop request: the ranks themselves under torchrun (so that torchrun sees them
    finish normally), ``srun`` itself under SLURM (it forwards SIGTERM to every task)."""
    return "launcher" if plan.mode == "srun" else "ranks"


def run_plan(plan: LaunchPlan, *, stream: TextIO | None = None, verbose: bool = False) -> JobOutcome:
    """Run a local plan (``torchrun``/``cpu``/``srun``) to completion (see ``supervisor``)."""
    if plan.mode == "sbatch":
        raise ValueError("an sbatch plan is submitted by the user, not run by the harness")
    env = {**os.environ, **plan.env, **plan.supervised_env}
    return supervise(
        plan.argv,
        env,
        plan.log_dir,
        stop_target(plan),
        out=stream or sys.stdout,
        verbose=verbose,
        save_dir=plan.save_dir,
    )
