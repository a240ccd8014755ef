"""The scripts of ``scripts/performance/`` loaded as modules, for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts" / "performance"


def load_script(filename: str) -> ModuleType:
    """``scripts/performance/<filename>`` as a module, registered before it runs: dataclasses look
    their module up while a class is built."""
    spec = importlib.util.spec_from_file_location(Path(filename).stem, SCRIPTS / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
