"""The machine this process runs on, as every host-dependent decision reads it.

Validation, resolution, the ``auto`` choices and the GPU-count checks ask one object,
:func:`current_host`, for the facts of the machine: its GPU (capability, name, count), its memory,
and which optional packages import (Transformer Engine, and any module a dispatch path needs, such
as DeepEP's ``deep_ep`` or Transformer Engine's NCCL EP module). On a real run
that is :class:`RealHost`, which probes each fact once, when first asked (a TE import or an
``nvidia-smi`` call costs seconds, and a dry run that never asks pays nothing).

:func:`use_host` puts a :class:`HostFacts` record in its place: a test states the machine it is
about instead of depending on the one it happens to run on.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Protocol

from packaging.version import Version

GpuIdentity = tuple[tuple[int, int] | None, str | None]
"""``(capability, name)`` of GPU 0, or ``(None, None)`` without a usable GPU."""


class Host(Protocol):
    """The facts of a machine that decisions before launch depend on."""

    def gpu(self) -> GpuIdentity: ...

    def gpu_count(self) -> int: ...

    def memory_bytes(self) -> int | None: ...

    def te_version(self) -> Version | None: ...

    def has_package(self, module: str) -> bool: ...


@dataclass(frozen=True)
class HostFacts:
    """A machine described rather than probed (tests, and what a record of a run says it ran on)."""

    gpu_capability: tuple[int, int] | None = None
    gpu_name: str | None = None
    gpus: int = 0
    memory: int | None = None
    """Bytes this process's group may use; ``None``: unknown."""
    transformer_engine: str | None = None
    """Transformer Engine's version; ``None``: it does not import."""
    packages: tuple[str, ...] = ()
    """The optional modules that import (``("deep_ep", "transformer_engine.pytorch.ep")``)."""

    def gpu(self) -> GpuIdentity:
        return (self.gpu_capability, self.gpu_name) if self.gpus else (None, None)

    def gpu_count(self) -> int:
        return self.gpus

    def memory_bytes(self) -> int | None:
        return self.memory

    def te_version(self) -> Version | None:
        return None if self.transformer_engine is None else Version(self.transformer_engine)

    def has_package(self, module: str) -> bool:
        return module in self.packages


class RealHost:
    """This machine, each fact probed when first asked and then kept."""

    def gpu(self) -> GpuIdentity:
        return _probe_gpu()

    def gpu_count(self) -> int:
        return _probe_gpu_count()

    def memory_bytes(self) -> int | None:
        return _probe_memory()

    def te_version(self) -> Version | None:
        return _probe_te_version()

    def has_package(self, module: str) -> bool:
        return _probe_package(module)


_REAL: Host = RealHost()
_active: Host | None = None


def current_host() -> Host:
    """The machine decisions are made for: the one :func:`use_host` set, else this machine."""
    return _active if _active is not None else _REAL


@contextlib.contextmanager
def use_host(host: Host) -> Iterator[Host]:
    """Within the block, :func:`current_host` is ``host``."""
    global _active
    before, _active = _active, host
    try:
        yield host
    finally:
        _active = before


# ------------------------------------------------------------------------------------------ probes
@functools.cache
def _probe_gpu() -> GpuIdentity:
    """GPU 0 of this machine. Unless CUDA is already initialised, ``nvidia-smi`` answers: validation
    runs before training sets ``CUDA_DEVICE_MAX_CONNECTIONS``, which CUDA reads when it initialises."""
    # Deferred: torch takes seconds to import, and the harness reads its -g choices before it knows
    # whether it will build a config at all (-h, a mistyped flag).
    import torch

    try:
        if not torch.cuda.is_available():
            return None, None
        if not torch.cuda.is_initialized():
            found = nvidia_smi_gpu()
            if found[0] is not None:
                return found
        return tuple(torch.cuda.get_device_capability(0)), torch.cuda.get_device_name(0)
    except Exception:  # a broken driver is "no GPU" for validation purposes
        return None, None


def _probe_gpu_count() -> int:
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    import torch  # deferred, as in _probe_gpu

    try:
        return torch.cuda.device_count()
    except Exception:  # a broken driver counts as no GPU
        return 0


def nvidia_smi_gpu() -> GpuIdentity:
    """GPU 0 as ``nvidia-smi`` reports it, never asking torch (so CUDA stays uninitialised);
    ``(None, None)`` when it cannot tell."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return parse_nvidia_smi(out)
    except (OSError, subprocess.SubprocessError):
        return None, None


def parse_nvidia_smi(text: str) -> GpuIdentity:
    """Parse ``NVIDIA H100 80GB HBM3, 9.0`` (first line) into ``((9, 0), "NVIDIA H100 80GB HBM3")``."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or "," not in lines[0]:
        return None, None
    name, _, cap = lines[0].rpartition(",")
    major, _, minor = cap.strip().partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return None, None
    return (int(major), int(minor)), name.strip()


def _probe_memory() -> int | None:
    """The physical memory, or the control group's limit when it is lower; ``None`` when neither
    can be read."""
    try:
        physical: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        physical = None
    limits = [
        _read_int(Path("/sys/fs/cgroup/memory.max")),
        _read_int(Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")),
        physical,
    ]
    known = [v for v in limits if v]
    return min(known) if known else None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) < 30 else None


_TE_DISTRIBUTIONS = ("transformer-engine", "transformer_engine", "transformer-engine-torch")


@functools.cache
def _probe_te_version() -> Version | None:
    """Transformer Engine's version when it imports (its CUDA libraries load at import, so a
    distribution record alone is not enough), else ``None``."""
    try:
        # Deferred: Transformer Engine is optional, and loads its CUDA libraries at import.
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # any import failure (missing package, missing CUDA libs) means "absent"
        return None
    for name in _TE_DISTRIBUTIONS:
        try:
            return Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    version = getattr(transformer_engine, "__version__", None)
    return Version(str(version)) if version else None


@functools.cache
def _probe_package(module: str) -> bool:
    """Whether ``module`` imports. A top-level package is looked up without running it
    (``deep_ep``); a module inside a package is imported, since finding it runs its package anyway
    and a package such as Transformer Engine only proves it works by loading its CUDA libraries
    (``transformer_engine.pytorch.ep`` exists only in a TE built with ``NVTE_BUILD_WITH_NCCL_EP=1``)."""
    try:
        if "." not in module:
            return importlib.util.find_spec(module) is not None
        importlib.import_module(module)
    except Exception:  # any import failure (missing module, missing CUDA libraries) means absent
        return False
    return True
