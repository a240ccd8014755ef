"""One resolved, launchable run (:class:`Job`) and its plan: resolved once, the launch planned, what
it will do said before launch (``describe``), and whether this machine can run it (``check_machine``).

Nothing here writes or launches; ``execution`` does, from a :class:`Job`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from megatron.bridge.perf.harness.config_builder import (
    BuiltConfig,
    HarnessError,
    effective_values,
    environment_summary,
    format_effective_rows,
    gpus_visible,
    resolution_of,
)
from megatron.bridge.perf.harness.flag_notes import built_config_notes
from megatron.bridge.perf.harness.harness_args import HarnessArgs
from megatron.bridge.perf.harness.launch_values import launch_problems
from megatron.bridge.perf.harness.launcher import CONFIG_NAME, LaunchPlan, choose_mode, plan_launch
from megatron.bridge.perf.harness.run_dir import RunDirClaim
from megatron.bridge.training.harness_surface import CheckpointDir, allocator_env, inspect_checkpoint_dir
from megatron.bridge.utils.gpu_count import too_few_gpus
from megatron.bridge.utils.owned_files import describe_os_error, replace_file

if TYPE_CHECKING:
    from megatron.bridge.training.harness_surface import ConfigContainer, Resolution

EXIT_CONFIG = 2
EXIT_ENVIRONMENT = 3


@dataclass
class Job:
    """One resolved, launchable run: everything it shows, saves and launches comes from ``resolution``."""

    built: BuiltConfig
    resolution: Resolution
    plan: LaunchPlan
    config_text: str
    """The YAML the ranks load (copies equal the effective values), written by ``execution.prepare``; the
    ranks get its digest and refuse any other file."""
    claim: RunDirClaim | None = None
    """The harness's hold on its run directory, from ``execution.prepare`` on."""

    @property
    def resolved(self) -> ConfigContainer:
        """The finalized config the ranks will train."""
        return self.resolution.trained

    @property
    def report(self) -> str:
        """The full overlap report, without its heading line (``describe`` prints its own)."""
        return self.resolution.report.format(heading=False)

    @property
    def brief_report(self) -> str:
        """The overlap report without the lines the ranks' start-up repeats."""
        return self.resolution.report.format(brief=True)

    def save_config(self, path: str | Path) -> None:
        """Write the effective config (what the ranks load) where ``--save_config_filepath`` says."""
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            replace_file(path, self.config_text)
        except OSError as exc:
            raise HarnessError(f"--save_config_filepath {path}: {describe_os_error(exc, path)}") from None


def checkpoint_notes(resolved) -> list[str]:
    """Where the run starts from, said before launch (validation has refused unusable directories)."""
    ckpt = resolved.checkpoint
    if not ckpt.load:
        if ckpt.save:
            return [f"starts from iteration 0; checkpoints go to {ckpt.save}"]
        return ["no checkpoints (checkpoint.save=DIR checkpoint.load=DIR: save there, resume from there)"]
    found = inspect_checkpoint_dir(ckpt.load)
    done = _finished(resolved, found)
    if done:
        return [done]
    if found.resumable:
        return [f"resumes from iteration {found.iteration} in {ckpt.load}"]
    return [f"{ckpt.load} holds no checkpoint yet: starts from iteration 0 and saves there"]


def nothing_to_train(resolved) -> str | None:
    """Why the run has no step left (``checkpoint.load`` already holds ``train.train_iters``
    iterations or more), decided here so that no rank is started for it; ``None`` otherwise."""
    if not resolved.checkpoint.load:
        return None
    return _finished(resolved, inspect_checkpoint_dir(resolved.checkpoint.load))


def _finished(resolved, found: CheckpointDir) -> str | None:
    """:func:`nothing_to_train` for the ``checkpoint.load`` directory already read as ``found``."""
    total = resolved.train.train_iters
    if not isinstance(total, int) or not found.resumable or found.iteration is None or found.iteration < total:
        return None
    return (
        f"nothing to train: {resolved.checkpoint.load} holds iteration {found.iteration} "
        f"and train.train_iters={total} "
        f"(to train on, raise --max_steps / train.train_iters above {found.iteration}; to start over, "
        "point checkpoint.load at another directory)"
    )


def data_notes(resolved) -> list[str]:
    """Which data trains, said before launch when it is not mock data (``dataset.data_path`` is the
    alias that writes ``dataset.data_paths``)."""
    ds = resolved.dataset
    if ds.is_mock:
        return []
    return [f"data: indexed dataset dataset.data_paths={ds.data_paths} (alias dataset.data_path)"]


def make_job(built: BuiltConfig, args: HarnessArgs, max_connections: int | None = None) -> Job:
    """Resolve once (raises ``ConfigError`` with every violation) and plan the launch."""
    built.notes += built_config_notes(args, built)  # a flag and a dotted override that set one field
    resolution = resolution_of(built)
    text = resolution.effective.to_yaml()
    return Job(built, resolution, plan_job(built, resolution, args, max_connections, digest(text)), text)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def plan_job(
    built: BuiltConfig,
    resolution: Resolution,
    args: HarnessArgs,
    max_connections: int | None = None,
    config_sha256: str | None = None,
    allocator: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """The launch of a resolved job. ``max_connections`` replaces the report's
    ``CUDA_DEVICE_MAX_CONNECTIONS`` and ``allocator`` the allocator setting the job would launch with
    (sweeps keep the environment identical across values)."""
    needed = resolution.report.cuda_device_max_connections
    launched_gpus, gpus_per_node = (1, 1) if built.emulated else (built.num_gpus, built.gpus_per_node)
    problems = launch_problems(
        account=args.account,
        partition=args.partition,
        time_limit=args.time_limit,
        log_dir=built.log_dir,
        written_to_batch_script=choose_mode(
            cpu=built.cpu, num_gpus=launched_gpus, gpus_per_node=gpus_per_node, environ=os.environ
        )
        == "sbatch",
    )
    if problems:
        raise HarnessError("the launch cannot be written:\n" + "\n".join(f"  - {p}" for p in problems), EXIT_CONFIG)
    return plan_launch(
        cpu=built.cpu,
        num_gpus=launched_gpus,  # an emulated world is one process
        gpus_per_node=gpus_per_node,
        procs_per_gpu=built.procs_per_gpu,
        config_path=built.log_dir / CONFIG_NAME,
        log_dir=built.log_dir,
        cuda_device_max_connections=max_connections if max_connections is not None else needed,
        extra_env=allocator if allocator is not None else allocator_env(resolution.trained.model, os.environ),
        account=args.account,
        partition=args.partition,
        time_limit=args.time_limit,
        job_name=built.recipe.function_name.removesuffix("_config"),
        verbose=args.verbose,
        config_sha256=config_sha256,
        save_dir=resolution.trained.checkpoint.save,
    )


def describe(job: Job, out: TextIO, *, verbose: bool = True, dryrun: bool = False) -> None:
    """What will run: environment, notes, overlap report, effective values, launch command (in a
    dry run an sbatch script is only described: nothing is written)."""
    print(f"== {environment_summary(job.built)}", file=out)
    for note in job.built.notes + job.plan.notes + checkpoint_notes(job.resolved) + data_notes(job.resolved):
        print(f"   note: {note}", file=out)
    if verbose:
        print("== overlap report", file=out)
        print(job.report, file=out)
        print("== effective overlap-related values [source]", file=out)
        print(format_effective_rows(effective_values(job.built, job.resolution)), file=out)
    else:
        print("== " + job.brief_report, file=out)
    print(f"== launch ({job.plan.mode})", file=out)
    print(f"   {job.plan.shell()}", file=out)
    if job.plan.script_text:
        if dryrun:
            print(f"   (dry run: {job.plan.script_path} is not written; run without --dryrun to write it)", file=out)
        print("   the script runs, on every node:", file=out)
        print("   " + next(line for line in job.plan.script_text.splitlines() if line.startswith("srun")), file=out)


def check_machine(job: Job) -> None:
    """Fail fast when this machine cannot run the job locally (instead of hanging in NCCL init)."""
    if job.plan.mode == "srun" and shutil.which("srun") is None:
        raise HarnessError(
            "SLURM_JOB_ID is set, so the job would start with srun, but this machine has no srun on PATH. "
            "Run the harness inside the allocation (where srun exists), or unset SLURM_JOB_ID to launch here",
            EXIT_ENVIRONMENT,
        )
    if job.plan.mode != "torchrun":
        return
    have, need = gpus_visible(), 1 if job.built.emulated else job.built.num_gpus
    if have < need:
        raise HarnessError(
            f"{too_few_gpus(have, need, f'-ng {need}')}. "
            "Use --dryrun to validate here, -g cpu for the CPU smoke mode, run inside a SLURM "
            "allocation (srun), or ask for more GPUs per node with -gn to get an sbatch script.",
            EXIT_ENVIRONMENT,
        )
