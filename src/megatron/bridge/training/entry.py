"""Process entry point the launchers start on every rank.

    python -m megatron.bridge.training.entry --config-file RESOLVED.yaml [--config-file NEXT.yaml ...]

(under ``torchrun``/``python -m torch.distributed.run`` or ``srun``). It loads the YAML written by
``ConfigContainer.to_yaml`` and calls :func:`megatron.bridge.training.pretrain.pretrain`. A failing
rank prints its error with its rank and exits non-zero, so the launcher stops the job; collectives
use ``cfg.dist.distributed_timeout_minutes``, so the other ranks cannot hang forever.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from typing import Iterator, Optional, Sequence


def _rank() -> str:
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run megatron-core training from a resolved config.")
    parser.add_argument(
        "--config-file", required=True, action="append",
        help="YAML written by ConfigContainer.to_yaml(); repeat it to train several configs one after "
        "another in the same processes (benchmarks: one start-up for many runs)",
    )
    return parser.parse_args(argv)


@contextlib.contextmanager
def _one_process_group(configs: list) -> Iterator[None]:
    """Several configs: create the default process group once, so every run reuses it (``pretrain``
    leaves a group it did not create in place) and the job tears it down once at the end."""
    if len(configs) < 2:
        yield
        return
    from megatron.bridge.training import initialize

    env = initialize.launch_env()
    initialize.initialize_distributed(configs[0].validate(world_size=env.world_size), env)
    try:
        yield
    finally:
        initialize.teardown()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Load the config, train, and return the process exit code."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"[rank {_rank()}] %(levelname)s %(name)s: %(message)s"
    )
    try:
        from megatron.bridge.training.config import ConfigContainer
        from megatron.bridge.training.pretrain import pretrain

        configs = [ConfigContainer.from_yaml(path) for path in args.config_file]
        with _one_process_group(configs):
            for cfg in configs:
                pretrain(cfg)
    except Exception as exc:  # report on this rank, exit non-zero: the launcher stops the job
        sys.stdout.flush()
        print(f"[rank {_rank()}] training failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
