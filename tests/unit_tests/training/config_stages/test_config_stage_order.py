"""The configuration package is filed by stage, and a stage imports only from itself or an earlier one.

``src/megatron/bridge/training/config_stages/`` holds one sub-package per stage a value passes through,
in the order of :data:`STAGES`. Every module of the package is parsed with ``ast`` (nothing is
imported): every ``import`` and ``from ... import`` counts, at module level and inside functions,
methods and ``if TYPE_CHECKING:`` blocks alike, in absolute and relative form (``from . import x``,
``from ..facts import y``). No exemption is needed: a name used only in annotations is imported from
an earlier stage or from outside the package (``ConfigContainer``, from ``training/config.py``).

The public modules above the package (:data:`FACES`) may call into it; the package may name them
only under ``if TYPE_CHECKING:`` (annotations never run, and a run-time import would close a cycle
with the face that calls the stage).

The configuration does not reach into the run: no stage imports the training loop or the device
layer (:data:`RUN_PACKAGES`), not even for an annotation. What a rule needs to know of the file system
or of a CUDA graph (checkpoint directory, save lock, data files, sample counts, the capturing
iteration) is a fact, in ``facts/``, which the run reads too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[4] / "src"
PACKAGE = "megatron.bridge.training.config_stages"
STAGES: tuple[str, ...] = ("schema", "facts", "reading", "rules", "resolution")
FACES: tuple[str, ...] = (
    "megatron.bridge.training.config",
    "megatron.bridge.training.comm_overlap",
    "megatron.bridge.training.flex_dispatcher_backend",
    "megatron.bridge.training.mixed_precision",
    "megatron.bridge.training.pretrain",
    "megatron.bridge.training.utils.omegaconf_utils",
)

RUN_PACKAGES: tuple[str, ...] = ("megatron.bridge.training.loop", "megatron.bridge.training.devices")
"""The packages of the run (the training loop's steps, GPUs against CPU smoke mode): they build on the
configuration, never the other way round."""


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST, type_checking: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every import statement at any depth, with whether it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, type_checking
        if _is_type_checking(child):
            for stmt in child.body:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), True)
            for stmt in child.orelse:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), type_checking)
        else:
            yield from _imports(child, type_checking)


def imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Absolute dotted names an import statement may load: ``from a import b`` gives ``a`` and
    ``a.b`` (``b`` may be a module), relative forms resolved against ``module``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    return [origin] + [f"{origin}.{alias.name}" for alias in node.names]


def stage_of(name: str, package: str = PACKAGE) -> int | None:
    """Index in :data:`STAGES` of the stage a dotted name lies in; ``None`` outside the stages."""
    if not name.startswith(package + "."):
        return None
    stage = name[len(package) + 1 :].split(".")[0]
    return STAGES.index(stage) if stage in STAGES else None


def violations(src: Path = SRC, package: str = PACKAGE, faces: tuple[str, ...] = FACES) -> list[str]:
    """``module (stage) -> imported (later stage)`` for every backward import in ``package``, and every
    run-time import of a face; also a module that is in no stage."""
    root = src / Path(*package.split("."))
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, src)
        own = stage_of(module, package)
        if own is None:
            if module != package:
                found.append(f"{module} is in no stage (stages: {', '.join(STAGES)})")
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, type_checking in _imports(tree):
            for name in imported_names(node, module, path.name == "__init__.py"):
                other = stage_of(name, package)
                if other is not None and other > own:
                    found.append(f"{module} ({STAGES[own]}) imports {name} ({STAGES[other]}), line {node.lineno}")
                if not type_checking and any(name == face or name.startswith(face + ".") for face in faces):
                    found.append(f"{module} imports the public module {name} at run time, line {node.lineno}")
    return sorted(set(found))


def run_imports(src: Path = SRC, package: str = PACKAGE, run_packages: tuple[str, ...] = RUN_PACKAGES) -> list[str]:
    """``module imports name, line N`` for every import of a run package by a module of ``package``,
    at any depth and under ``if TYPE_CHECKING:`` alike."""
    root = src / Path(*package.split("."))
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, src)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, _ in _imports(tree):
            for name in imported_names(node, module, path.name == "__init__.py"):
                if any(name == run or name.startswith(run + ".") for run in run_packages):
                    found.append(f"{module} imports {name}, line {node.lineno}")
    return sorted(set(found))


def test_every_stage_imports_only_from_itself_or_an_earlier_stage() -> None:
    found = violations()
    assert not found, "imports against the stage order " + " -> ".join(STAGES) + ":\n" + "\n".join(found)


def test_no_stage_imports_the_training_loop_or_the_devices() -> None:
    found = run_imports()
    assert not found, (
        "the configuration imports the run (" + ", ".join(RUN_PACKAGES) + "); move the fact it "
        "needs into facts/:\n" + "\n".join(found)
    )


def test_the_stages_are_the_sub_packages() -> None:
    root = SRC / Path(*PACKAGE.split("."))
    packages = sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(STAGES)
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py"]


def test_module_names_are_unique_across_the_stages() -> None:
    """A topic lives in one file: no two modules of the package share a basename."""
    names = [p.stem for p in (SRC / Path(*PACKAGE.split("."))).rglob("*.py") if p.stem != "__init__"]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def _write(root: Path, relative: str, text: str = "") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _synthetic(tmp_path: Path, facts_module: str) -> Path:
    pkg = "fake/stages"
    for stage in STAGES:
        _write(tmp_path, f"{pkg}/{stage}/__init__.py")
    _write(tmp_path, f"{pkg}/__init__.py")
    _write(tmp_path, f"{pkg}/schema/base.py", "X = 1\n")
    _write(tmp_path, f"{pkg}/rules/later.py", "Y = 2\n")
    _write(tmp_path, f"{pkg}/facts/probe.py", facts_module)
    return tmp_path


def _check(tmp_path: Path, facts_module: str) -> list[str]:
    src = _synthetic(tmp_path, facts_module)
    return violations(src, "fake.stages", ("fake.face",))


def test_checker_accepts_imports_of_earlier_stages(tmp_path: Path) -> None:
    text = "from fake.stages.schema.base import X\nfrom ..schema import base\nimport fake.stages.schema.base\n"
    assert _check(tmp_path, text) == []


def test_checker_catches_an_absolute_backward_import(tmp_path: Path) -> None:
    found = _check(tmp_path, "from fake.stages.rules.later import Y\n")
    assert found == [
        "fake.stages.facts.probe (facts) imports fake.stages.rules.later (rules), line 1",
        "fake.stages.facts.probe (facts) imports fake.stages.rules.later.Y (rules), line 1",
    ]


def test_checker_catches_a_relative_backward_import_inside_a_function(tmp_path: Path) -> None:
    found = _check(tmp_path, "def f():\n    from ..rules import later\n    return later\n")
    assert "fake.stages.facts.probe (facts) imports fake.stages.rules.later (rules), line 2" in found


def test_checker_catches_a_backward_import_under_type_checking(tmp_path: Path) -> None:
    text = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import fake.stages.rules.later\n"
    assert _check(tmp_path, text) == ["fake.stages.facts.probe (facts) imports fake.stages.rules.later (rules), line 3"]


def test_checker_catches_a_run_time_import_of_a_face_but_not_an_annotation_one(tmp_path: Path) -> None:
    text = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake.face import A\n\ndef f():\n"
    text += "    from fake import face\n    return face\n"
    assert _check(tmp_path, text) == ["fake.stages.facts.probe imports the public module fake.face at run time, line 6"]


def test_checker_reports_a_module_outside_every_stage(tmp_path: Path) -> None:
    _write(tmp_path, "fake/stages/loose.py")
    assert _check(tmp_path, "") == ["fake.stages.loose is in no stage (stages: " + ", ".join(STAGES) + ")"]


@pytest.mark.parametrize(
    "text, line",
    [
        ("from fake.run.loop import steps\n", 1),
        ("def f():\n    import fake.run.loop.steps\n", 2),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake.run import devices\n", 3),
    ],
)
def test_checker_catches_an_import_of_the_run(tmp_path: Path, text: str, line: int) -> None:
    src = _synthetic(tmp_path, text)
    found = run_imports(src, "fake.stages", ("fake.run.loop", "fake.run.devices"))
    assert len(found) >= 1 and all(f.startswith("fake.stages.facts.probe imports fake.run.") for f in found)
    assert {f.rsplit("line ", 1)[1] for f in found} == {str(line)}


def test_checker_leaves_a_package_whose_name_only_begins_like_the_run(tmp_path: Path) -> None:
    src = _synthetic(tmp_path, "import fake.run.loopback\nfrom fake.run import loop_notes\n")
    assert run_imports(src, "fake.stages", ("fake.run.loop",)) == []


def _imports_of(module: str) -> set[str]:
    path = SRC / Path(*module.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text(), filename=str(path))
    return {name for node, _ in _imports(tree) for name in imported_names(node, module, False)}


def test_the_override_modules_call_one_way() -> None:
    """``hydra_overrides`` -> ``overrides`` -> ``override_text``, and ``hydra_overrides`` -> ``override_text``:
    one job per module, no call back up (an import of a module is every way to call into it)."""
    reading = f"{PACKAGE}.reading"
    hydra, overrides, text = f"{reading}.hydra_overrides", f"{reading}.overrides", f"{reading}.override_text"
    assert {overrides, text} <= _imports_of(hydra)
    assert text in _imports_of(overrides) and hydra not in _imports_of(overrides)
    assert not {hydra, overrides} & _imports_of(text)
