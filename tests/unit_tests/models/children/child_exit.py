"""How the multi-rank child programs end (imported from beside them): report, then leave together.

A child's work is done once its ``REPORT`` line is out, and its exit status should say only
whether it got there. Two teardown hazards of a gloo process group made it say more:

* a rank that closes its connections while a peer is still inside a collective can fail that
  peer; the barrier lets every rank finish all of its collectives first;
* once, in CI, a child that had printed a complete and correct report was then killed by
  ``std::terminate`` (SIGABRT, "terminate called without an active exception", the message of a
  C++ thread object destroyed while still joinable) as it shut down. It did not recur in 25 local
  runs of the same child. After an orderly ``destroy_process_group`` the child now leaves with
  ``os._exit``, which skips the interpreter's teardown of torch's objects; everything the test
  reads is flushed by then.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

REPORT_PREFIX = "REPORT "


def finish(report: dict) -> None:
    """Print ``report`` as the ``REPORT`` line, wait for every rank, destroy the default group and
    exit 0. Does not return."""
    print(REPORT_PREFIX + json.dumps(report), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
