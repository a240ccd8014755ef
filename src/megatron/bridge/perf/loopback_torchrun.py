"""``torchrun`` for one machine whose rendezvous store listens on the loopback interface only.

``torchrun --standalone`` serves its rendezvous store (and the store the ranks share) on every
interface of the machine, without authentication: on a shared login or compute node anyone who
can reach the port can read and write the job's keys. This launcher registers a rendezvous
backend, :data:`BACKEND`, through torch's own handler registry and then runs ``torchrun`` with
it: the agent serves one store on ``127.0.0.1`` and hands the ranks that address, so nothing of
the job listens beyond the machine. The harness uses it for every single-node launch and sets
``GLOO_SOCKET_IFNAME=lo`` for the CPU smoke mode's gloo connections.

    python -m megatron.bridge.perf.loopback_torchrun --nproc-per-node=N [torchrun flags] -m module args
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)
from torch.distributed.run import main as torchrun_main

from megatron.bridge.perf.harness.launcher import LOOPBACK
from megatron.bridge.perf.harness.launcher import LOOPBACK_BACKEND as BACKEND


class LoopbackRendezvous(RendezvousHandler):
    """The rendezvous of a one-node job: this agent is node 0 of 1 and serves the store on loopback."""

    def __init__(self, run_id: str, timeout: timedelta) -> None:
        self._run_id, self._timeout = run_id, timeout
        self._store: TCPStore | None = None
        self._listener: socket.socket | None = None

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._listener = socket.create_server((LOOPBACK, 0), backlog=1024)
            self._store = TCPStore(
                LOOPBACK,
                self._listener.getsockname()[1],
                is_master=True,
                master_listen_fd=self._listener.fileno(),
                wait_for_workers=False,
                multi_tenant=True,
                timeout=self._timeout,
            )
        return RendezvousInfo(
            PrefixStore(self._run_id, self._store), 0, 1, RendezvousStoreInfo(LOOPBACK, self._store.port)
        )

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        return True


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's registry calls this for ``--rdzv-backend=loopback``."""
    return LoopbackRendezvous(params.run_id, timedelta(seconds=int(params.config.get("timeout", 900))))


def main(argv: Sequence[str] | None = None) -> None:
    rendezvous_handler_registry.register(BACKEND, create_handler)
    torchrun_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
