"""Test-wide settings and fixtures.

Quiets megatron-core's import-time warnings about missing TE/Apex, and offers ``gloo_world``: a
world-size-1 gloo process group for in-process tests of distributed code,
``resolution_counter``: how often a configuration is resolved, and ``run_on_free_port``: a child
launch on a free TCP port, retried on another when the port was taken in between.
"""

import json
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
warnings.filterwarnings("ignore", message=".*absl.logging.*")


def free_port() -> int:
    """A TCP port nobody listens on right now (another process may take it before the caller binds
    it: see :func:`run_on_a_free_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PORT_TAKEN = ("eaddrinuse", "address already in use")  # torch's store and Python's socket errors, lowercased
_PORT_ATTEMPTS = 3


def _lost_its_port(stderr: str | None) -> bool:
    """Whether a child failed because another process bound its port between :func:`free_port` and
    the child's own bind (two test runs at once)."""
    return any(sign in (stderr or "").lower() for sign in _PORT_TAKEN)


def run_on_a_free_port(launch, pick_port=free_port, **common) -> subprocess.CompletedProcess:
    """``subprocess.run(**launch(port), **common)`` on a ``pick_port()`` port (``launch`` returns the
    keyword arguments that carry the port: ``args``, or ``env``), again on a new port when the child
    lost its port to another process."""
    for _ in range(_PORT_ATTEMPTS):
        proc = subprocess.run(**launch(pick_port()), **common)
        if proc.returncode == 0 or not _lost_its_port(proc.stderr):
            return proc
    return proc


@pytest.fixture(scope="session")
def run_on_free_port():
    """:func:`run_on_a_free_port`, for tests that launch their own distributed children."""
    return run_on_a_free_port


@pytest.fixture(scope="module")
def gloo_world() -> Iterator[None]:
    """A single-process gloo group for one test module (torn down after it, so later modules
    start without a process group)."""
    created = False
    if not dist.is_initialized():
        # An in-memory store: no port that another process could take first, and none in the
        # environment for child processes spawned by other tests to inherit.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        created = True
    yield
    if created and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def resolution_counter(monkeypatch) -> list:
    """Counts how often the overlap switches are resolved (every reference to the resolving
    function in a loaded module is wrapped, so no caller escapes the count)."""
    from megatron.bridge.training.config_stages.resolution import overlap_resolution as resolution

    original, calls = resolution.resolve_overlap_values, []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "resolve_overlap_values", None) is original:
            monkeypatch.setattr(module, "resolve_overlap_values", counted)
    return calls


REPORT_PREFIX = "REPORT "


@pytest.fixture(scope="session")
def run_child_script():
    """Run a test's child program (a file) on ``world_size`` processes (argv:
    ``RANK PORT``; ``WORLD_SIZE`` and ``env_extra`` in the environment) and return each rank's
    ``REPORT {json}`` line as a dict (its stdout under ``"stdout"``).

    For code that must not run in the test process: the CPU compatibility layer patches torch for
    the whole process, and multi-rank runs need their own processes. The children run in
    ``workdir``, so whatever they write stays out of the repository. Children that lost their port
    to another process run again on a new one.
    """

    def run(
        script: Path, workdir: Path, world_size: int = 1, timeout: float = 300, env_extra: dict | None = None
    ) -> list[dict]:
        repo = Path(__file__).resolve().parents[1]
        # src first, then whatever the parent had (a machine whose megatron-core comes through PYTHONPATH)
        path = os.pathsep.join(filter(None, [str(repo / "src"), os.environ.get("PYTHONPATH")]))
        env = dict(
            os.environ, PYTHONPATH=path, CUDA_VISIBLE_DEVICES="", WORLD_SIZE=str(world_size), **(env_extra or {})
        )
        for _ in range(_PORT_ATTEMPTS):
            port = str(free_port())
            procs = [
                subprocess.Popen(
                    [sys.executable, str(script), str(rank), port],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    cwd=workdir,
                )
                for rank in range(world_size)
            ]
            outputs = [p.communicate(timeout=timeout) for p in procs]
            if not any(p.returncode and _lost_its_port(err) for p, (_, err) in zip(procs, outputs)):
                break
        reports = []
        for proc, (out, err) in zip(procs, outputs):
            assert proc.returncode == 0, out[-3000:] + err[-5000:]
            line = next(text for text in out.splitlines() if text.startswith(REPORT_PREFIX))
            reports.append({**json.loads(line[len(REPORT_PREFIX) :]), "stdout": out})
        return reports

    return run


@pytest.fixture
def indexed_corpus(tmp_path) -> str:
    """A small indexed dataset (``.bin``/``.idx``, 64 documents of 300 tokens below 1000) as
    megatron-core's preprocessing writes it; returns its path prefix."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = str(tmp_path / "corpus_text_document")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(64):
        builder.add_item(torch.from_numpy(rng.integers(0, 1000, size=300, dtype=np.int32)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix
