"""Test-wide settings and fixtures.

Quiets megatron-core's import-time warnings about missing TE/Apex, and offers ``gloo_world``: a
world-size-1 gloo process group for in-process tests of distributed code.
"""

import os
import socket
import warnings
from typing import Iterator

import pytest
import torch.distributed as dist

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
warnings.filterwarnings("ignore", message=".*absl.logging.*")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_world() -> Iterator[None]:
    """A single-process gloo group for one test module (torn down after it, so later modules
    start without a process group)."""
    created = False
    if not dist.is_initialized():
        # An explicit init_method: child processes spawned by other tests must not inherit a port.
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        created = True
    yield
    if created and dist.is_initialized():
        dist.destroy_process_group()
