"""Process entry point the launchers start on every rank.

    python -m megatron.bridge.training.entry --config-file RESOLVED.yaml [--config-file NEXT.yaml ...]
        [--config-sha256 DIGEST ...] [--verbose]

(under ``torchrun``/``python -m torch.distributed.run`` or ``srun``). It loads the YAML written by
``ConfigContainer.to_yaml`` and calls :func:`megatron.bridge.training.pretrain.pretrain`.

* SIGTERM/SIGINT are caught before anything else is imported: the ranks finish the step they are
  in, save once and exit 0 (see ``stop_request``).
* A failing rank prints its error with its rank, writes ``<log_dir>/failures/rank_<N>.json`` (the
  time it failed, to the microsecond, and the error) and exits non-zero, so the launcher stops the
  job and the harness can name the rank that failed first. Collectives use
  ``cfg.dist.distributed_timeout_minutes``, so the other ranks cannot hang forever.
* Without ``--verbose`` the known third-party warnings and megatron-core's INFO dumps are dropped
  (``megatron.bridge.utils.quiet``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from megatron.bridge.training.loop.failure_cause import describe_failure
from megatron.bridge.training.loop.stop_request import STOP
from megatron.bridge.utils.owned_files import describe_os_error, make_dir, replace_file
from megatron.bridge.utils.quiet import configure_logging

FAILURE_DIR = "failures"


def _rank() -> str:
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run megatron-core training from a resolved config.")
    parser.add_argument(
        "--config-file",
        required=True,
        action="append",
        help="YAML written by ConfigContainer.to_yaml(); repeat it to train several configs one after "
        "another in the same processes (benchmarks: one start-up for many runs)",
    )
    parser.add_argument(
        "--config-sha256",
        action="append",
        default=None,
        help="the SHA-256 of each --config-file, in order: a file with other bytes is refused (the harness "
        "passes the digest of the config it wrote, so the ranks train exactly that)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="keep third-party warnings, megatron-core's INFO logs and the full start-up report",
    )
    return parser.parse_args(argv)


@contextlib.contextmanager
def _one_process_group(configs: list) -> Iterator[None]:
    """Several configs: create the default process group once, so every run reuses it (``pretrain``
    leaves a group it did not create in place) and the job tears it down once at the end."""
    if len(configs) < 2:
        yield
        return
    # Deferred: torch and megatron-core load only after the stop handler is installed (see _run).
    from megatron.bridge.training.loop import initialize
    from megatron.bridge.training.loop.world import world_for

    env = initialize.launch_env()
    world = world_for(configs[0])
    first = configs[0].validate(world_size=world.size_to_validate(env.world_size))
    initialize.initialize_distributed(first, world, env)
    try:
        yield
    finally:
        initialize.teardown(world)


def failure_record_path(log_dir: Path, rank: int) -> Path:
    return log_dir / FAILURE_DIR / f"rank_{rank:05d}.json"


def write_failure_record(log_dir: Path, exc: BaseException, save_dir: str | None = None) -> None:
    """What the harness needs to tell the first failing rank from the ones that failed after it: the
    error with its causes (``failure_cause.describe_failure``)."""
    record = {
        "rank": int(_rank()),
        "pid": os.getpid(),
        "time": time.time(),
        "error": describe_failure(exc, save_dir),
    }
    path = failure_record_path(log_dir, record["rank"])
    try:
        make_dir(path.parent, parents=True)
        replace_file(path, json.dumps(record))
    except OSError as err:  # the report is a convenience; never hide the real error behind it
        print(f"[rank {_rank()}] could not write {path}: {describe_os_error(err, path)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Load the config, train, and return the process exit code."""
    STOP.install()
    try:
        args = parse_args(argv)
        configure_logging(verbose=args.verbose, rank=_rank(), main_rank=_rank() == "0")
        return _run(args)
    finally:
        STOP.uninstall()


def _run(args: argparse.Namespace) -> int:
    log_dir = Path(args.config_file[0]).resolve().parent
    save_dir = None
    try:
        # Deferred: torch and megatron-core load after the stop handler is installed, and a failing
        # import is reported like any other failure of this rank.
        from megatron.bridge.training.config import ConfigContainer
        from megatron.bridge.training.pretrain import pretrain

        digests = args.config_sha256 or [None] * len(args.config_file)
        configs = [
            ConfigContainer.from_yaml(path, digest) for path, digest in zip(args.config_file, digests, strict=True)
        ]
        with _one_process_group(configs):
            for cfg in configs:
                log_dir = Path(cfg.logger.log_dir) if cfg.logger.log_dir else log_dir
                save_dir = cfg.checkpoint.save
                if pretrain(cfg, verbose=args.verbose).stopped_by_signal:
                    break  # a stop ends the process, not only the current config
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # torch's CheckpointException is a BaseException: it is a failure too
        sys.stdout.flush()
        print(f"[rank {_rank()}] training failed: {describe_failure(exc, save_dir)}", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        write_failure_record(log_dir, exc, save_dir)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
