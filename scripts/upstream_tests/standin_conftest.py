"""conftest.py of the scratch directory that runs Megatron-Bridge's own unit tests against this package.

``run_upstream_tests.py`` copies this file there as ``conftest.py``; it is never collected in this
repository. It does two things, and nothing else:

1. Stand-ins. Each upstream test file imports, at its top, modules and names this package does not
   have (``megatron.bridge.data.builders``, ``megatron.bridge.models.t5_provider``, private helpers of
   ``training.config``, upstream's ``scripts.performance``). Before collection, every
   ``from megatron.bridge... import`` / ``from scripts... import`` in the copied files is read
   (``ast``) and each missing module or name is given a stand-in class. Using a stand-in (calling it,
   reading an attribute) raises :class:`StandInUsed`, so a test that needs one fails and is out of
   scope; the package's own modules and names are never replaced.
2. The machine a test states. Upstream's tests state the GPU by mocking
   ``torch.cuda.get_device_properties``; this package reads the machine through one host object
   (``megatron.bridge.utils.host``), which its own tests set with ``use_host``. The fixture below
   makes the mocked GPU the host's GPU: read from the mock's ``return_value`` (the mock is not
   called), or, for a mock that raises, a GPU whose properties cannot be read. Every other fact is
   this machine's.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from unittest import mock

import pytest

HERE = Path(__file__).parent
STANDIN_ROOTS = ("megatron.bridge", "scripts.")
"""Imports of these are the ones a stand-in may answer."""


class StandInUsed(Exception):
    """A test used a module or name this package does not have."""


class _StandInType(type):
    def __call__(cls, *args, **kwargs):
        raise StandInUsed(f"{cls.__qualname__} is not in this package (called)")

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise StandInUsed(f"{cls.__qualname__} is not in this package (.{name} read)")


def _stand_in(qualname: str) -> type:
    """A class (so it may appear in annotations and ``isinstance``) that refuses every use."""
    return _StandInType(qualname, (), {"__module__": "standin"})


def _module_exists(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _provide(module_name: str, names: list[str]) -> None:
    """Make ``from module_name import names`` succeed: stand-in modules where a module is missing,
    stand-in names where an existing module lacks one."""
    parts = module_name.split(".")
    for end in range(1, len(parts) + 1):
        name = ".".join(parts[:end])
        if not _module_exists(name):
            module = types.ModuleType(name)
            module.__path__ = []
            sys.modules[name] = module
    module = importlib.import_module(module_name)
    for name in names:
        if name != "*" and not hasattr(module, name):
            setattr(module, name, _stand_in(f"{module_name}.{name}"))


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(STANDIN_ROOTS):
            yield node.module, [alias.name for alias in node.names]


def pytest_configure(config: pytest.Config) -> None:
    for path in sorted(HERE.rglob("*.py")):
        if path.name != "conftest.py":
            for module, names in _imports(path):
                _provide(module, names)


# ------------------------------------------------------------------------------ the stated machine
_UNREADABLE = object()
"""A GPU is there but reading its properties fails (a mock with an exception as side effect)."""


def _stated_gpu():
    """``(capability, name)`` of the GPU a mocked ``get_device_properties`` describes, :data:`_UNREADABLE`,
    or ``None`` when the test states no GPU."""
    import torch  # deferred: the stand-ins are installed before anything imports torch

    probe = torch.cuda.get_device_properties
    if not isinstance(probe, mock.Mock):
        return None
    effect = probe.side_effect
    if isinstance(effect, BaseException) or (isinstance(effect, type) and issubclass(effect, BaseException)):
        return _UNREADABLE
    props = probe.return_value
    major = getattr(props, "major", None)
    if not isinstance(major, int) or isinstance(major, bool):
        return None
    minor = props.minor if isinstance(getattr(props, "minor", None), int) else 0
    name = props.name if isinstance(getattr(props, "name", None), str) else None
    return (major, minor), name


class _StatedHost:
    """This machine, with the GPU the running test states."""

    def __init__(self, machine):
        self.machine = machine

    def gpu(self):
        stated = _stated_gpu()
        if stated is None:
            return self.machine.gpu()
        return (None, None) if stated is _UNREADABLE else stated

    def gpu_count(self) -> int:
        return self.machine.gpu_count() if _stated_gpu() is None else 1

    def __getattr__(self, fact):
        return getattr(self.machine, fact)


@pytest.fixture(autouse=True)
def stated_machine():
    try:
        from megatron.bridge.utils import host
    except ImportError:  # a version of the package without the host object: the GPU is read as before
        yield
        return
    with host.use_host(_StatedHost(host.current_host())):
        yield
