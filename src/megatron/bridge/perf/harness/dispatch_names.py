"""The dispatch paths' names, as the harness offers them before megatron-core is loaded.

The registry (``models/dispatch/path_registry.py``) lives under ``megatron.bridge.models``, whose
package imports megatron-core (seconds), while ``-h`` and a refused flag answer without it. So the
harness reads the registry's source: the modules its ``DISPATCH_PATHS`` lists and, in each, the
``name=`` and ``kind=`` of its ``PATH = DispatchPath(...)``, as the recipe lookup reads a family's
names. Where the source cannot say (a value that is not written out), the registry is imported and
answers itself. ``tests/unit_tests/perf/test_dispatch_names.py`` holds the two equal.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import megatron.bridge

DISPATCH_PACKAGE = "megatron.bridge.models.dispatch"
REGISTRY = "path_registry"
PATHS_NAME = "DISPATCH_PATHS"


def _package_dir() -> Path:
    return Path(megatron.bridge.__file__).parent / "models" / "dispatch"


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    """The value a module assigns to ``name`` at its top level."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node.value
    return None


def _imported_modules(tree: ast.Module) -> dict[str, str]:
    """Local name -> module of this package, for ``from megatron.bridge.models.dispatch import x``."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == DISPATCH_PACKAGE:
            found.update({alias.asname or alias.name: alias.name for alias in node.names})
    return found


def _path_record(module: str) -> tuple[str, str] | None:
    """``(name, kind)`` of ``PATH = DispatchPath(name=..., kind=...)`` in the path module."""
    tree = _parse(_package_dir() / f"{module}.py")
    call = _assigned(tree, "PATH") if tree is not None else None
    if not isinstance(call, ast.Call):
        return None
    words = {
        k.arg: k.value.value
        for k in call.keywords
        if k.arg in ("name", "kind") and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)
    }
    return (words["name"], words["kind"]) if len(words) == 2 else None


def paths_from_source() -> list[tuple[str, str]] | None:
    """``(name, kind)`` of every registered path, in registry order; ``None`` where the source cannot say."""
    tree = _parse(_package_dir() / f"{REGISTRY}.py")
    listed = _assigned(tree, PATHS_NAME) if tree is not None else None
    if tree is None or not isinstance(listed, ast.Tuple):
        return None
    modules = _imported_modules(tree)
    records = []
    for entry in listed.elts:
        if not (
            isinstance(entry, ast.Attribute)
            and entry.attr == "PATH"
            and isinstance(entry.value, ast.Name)
            and entry.value.id in modules
        ):
            return None
        record = _path_record(modules[entry.value.id])
        if record is None:
            return None
        records.append(record)
    return records


def flex_backend_names() -> tuple[str, ...]:
    """The flex backends (``--moe_flex_dispatcher_backend``'s choices besides ``None``), in registry order."""
    records = paths_from_source()
    if records is None:
        registry = importlib.import_module(f"{DISPATCH_PACKAGE}.{REGISTRY}")
        return registry.flex_backends()
    return tuple(name for name, kind in records if kind == "flex")
