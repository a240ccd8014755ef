"""The harness reaches the training side only through ``training/harness_surface.py``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.bridge.training import harness_surface

PERF = Path(__file__).resolve().parents[3] / "src" / "megatron" / "bridge" / "perf"
SURFACE_MODULE = "megatron.bridge.training.harness_surface"


def _training_imports(path: Path) -> list[str]:
    """Modules of ``megatron.bridge.training`` that ``path`` imports, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else ([alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
        )
        found += [name for name in names if name.startswith("megatron.bridge.training")]
    return found


@pytest.mark.parametrize("path", sorted(PERF.rglob("*.py")), ids=lambda p: p.relative_to(PERF).as_posix())
def test_the_harness_imports_the_training_side_only_through_its_surface(path):
    assert {m for m in _training_imports(path)} <= {SURFACE_MODULE}


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from megatron.bridge.training.loop.data import x\n")
    assert _training_imports(module) == ["megatron.bridge.training.loop.data"]


@pytest.mark.parametrize("name", harness_surface.__all__)
def test_every_name_of_the_surface_is_found_at_its_home(name):
    assert getattr(harness_surface, name) is not None


def _imports_for_type_checkers(source: str) -> dict[str, str]:
    """Name -> module of the imports under the module's ``if TYPE_CHECKING:``."""
    block = next(
        (
            node
            for node in ast.parse(source).body
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        ),
        None,
    )
    assert block is not None, "harness_surface has no `if TYPE_CHECKING:` imports: type checkers see every name as Any"
    return {
        alias.name: node.module or "" for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }


def test_type_checkers_see_every_name_of_the_surface_at_its_home():
    """The lazy table's names are imported again for type checkers, IDEs and import graphs: the same
    names from the same modules, so no edge of the harness is hidden from them."""
    assert _imports_for_type_checkers(Path(harness_surface.__file__).read_text()) == harness_surface.SURFACE


def test_the_imports_for_type_checkers_are_not_run():
    """They stay under ``TYPE_CHECKING``: importing the surface still loads none of its homes."""
    code = f"import sys, {SURFACE_MODULE}; print(sorted(set(sys.modules) & set({SURFACE_MODULE}.SURFACE.values())))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_name_outside_the_surface_is_refused_with_the_list():
    with pytest.raises(AttributeError, match="the harness's names are"):
        harness_surface.train_step  # noqa: B018


def test_the_surface_loads_nothing_until_a_name_is_asked_for():
    code = f"import sys, {SURFACE_MODULE}; print('megatron.core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
