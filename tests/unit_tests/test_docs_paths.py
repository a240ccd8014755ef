"""Every repository path the documentation names exists, so a moved file cannot leave a page pointing
at nothing.

The documents: ``README.md``, ``CONTRIBUTING.md`` and every ``docs/**/*.md``.

What counts as a path:

* every inline code span (one pair of back-ticks, outside fenced blocks), and every word of a fenced
  block that starts with one of :data:`ROOTS` (the commands' scripts, test files, YAML overlays);
* cleaned of a pytest selector (``::test_x``), a line number (``:12``), surrounding ``,;:()`` and a
  trailing ``/``;
* skipped when it is no single path: whitespace, a placeholder (``< > * { } $ [ ]`` or ``...``), a
  folder written in capitals (``DIR/``, ``PATH/``), an absolute path, a URL;
* a path when it starts with one of :data:`ROOTS`, or holds a ``/`` and ends with one of
  :data:`EXTENSIONS` (a bare file name such as ``summary.json`` or ``config.py`` names a file of the
  run or of the folder the sentence is about, and is not checked).

Where it must exist:

* ``src/``, ``tests/``, ``scripts/``, ``docs/``: from the repository root, exactly;
* ``megatron/core/...``: in the installed megatron-core;
* any other (``recipes/...``, which is also the package's ``recipes/``, and the package- or
  section-relative names the pages use: ``perf/harness/run.py``, ``config_stages/rules/registry.py``,
  ``unit_tests/perf/test_harness_start.py``): as the tail of a file or folder of the repository, or
  from the document's own folder;
* a path of another project that a page names as such (Megatron-Bridge's tests and scripts) is listed
  in :data:`OTHER_PROJECTS`, with the page that names it: anywhere else it is checked.
"""

from __future__ import annotations

import importlib.util
import os
import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("src/", "tests/", "scripts/", "docs/", "recipes/")
EXACT_ROOTS = ("src/", "tests/", "scripts/", "docs/")
EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".json", ".toml", ".sh", ".txt", ".lock")
MEGATRON_CORE = "megatron/core/"
SKIPPED_DIRS = {".git", ".venv", "__pycache__", "runs", ".pytest_cache", ".ruff_cache"}

OTHER_PROJECTS: dict[tuple[str, str], str] = {
    ("docs/compatibility.md", "tests/unit_tests/training/test_deepep.py"): "Megatron-Bridge's test",
    ("docs/compatibility.md", "tests/unit_tests/training/utils/test_omegaconf_utils.py"): "Megatron-Bridge's test",
    ("docs/compatibility.md", "tests/unit_tests/recipes/recipe_test_utils.py"): "Megatron-Bridge's test helper",
    ("docs/compatibility.md", "scripts/performance/configs/qwen"): "Megatron-Bridge's perf configs",
    ("docs/performance/harness.md", "utils/overrides.py"): "Megatron-Bridge's scripts/performance/utils",
}
"""(page, path) -> whose path it is: paths of other projects, named as theirs on that page."""

_SPAN = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
_CAPITALS = re.compile(r"[A-Z][A-Z0-9_]*")


def documents() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def named_path(text: str, *, fenced: bool = False) -> str | None:
    """The repository path ``text`` names (cleaned), or ``None`` when it names none (module rules)."""
    path = text.strip().strip(",;:()").split("::")[0]
    path = re.sub(r":\d+(-\d+)?$", "", path).rstrip("/")
    if (
        not path
        or any(c.isspace() for c in path)
        or any(c in path for c in "<>*{}$[]")
        or "..." in path
        or "://" in path
        or path.startswith(("/", "~"))
    ):
        return None
    if any(_CAPITALS.fullmatch(part) for part in path.split("/")[:-1]):
        return None
    if path.startswith(ROOTS) or path.startswith(MEGATRON_CORE):
        return path
    if not fenced and "/" in path and path.endswith(EXTENSIONS):
        return path
    return None


def named_paths(markdown: str) -> list[str]:
    """Every path a page names: inline code spans, and fenced words that start with a root."""
    found = []
    for block in _FENCE.findall(markdown):
        found += [p for word in block.split() if word.startswith(ROOTS) and (p := named_path(word, fenced=True))]
    found += [p for span in _SPAN.findall(_FENCE.sub("", markdown)) if (p := named_path(span))]
    return found


@lru_cache(maxsize=1)
def repository_paths() -> frozenset[str]:
    """Every file and folder of the working tree, relative to its root (tool and run folders left out)."""
    found = set()
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        rel = Path(folder).relative_to(REPO).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        found.update(prefix + name for name in [*dirs, *files])
    return frozenset(found)


def exists(path: str, page: Path) -> bool:
    """Whether ``path``, named on ``page``, is there (module rules)."""
    if path.startswith(EXACT_ROOTS):
        return path in repository_paths()
    if path.startswith(MEGATRON_CORE):
        spec = importlib.util.find_spec("megatron.core")
        return spec is not None and (Path(spec.origin).parents[1] / path.removeprefix("megatron/")).exists()
    return (
        path in repository_paths()
        or any(p.endswith("/" + path) for p in repository_paths())
        or (page.parent / path).exists()
    )


@pytest.mark.parametrize("page", documents(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_repository_path_a_page_names_exists(page):
    name = page.relative_to(REPO).as_posix()
    missing = sorted(
        {
            path
            for path in named_paths(page.read_text(encoding="utf-8"))
            if (name, path) not in OTHER_PROJECTS and not exists(path, page)
        }
    )
    assert not missing, f"{name} names paths that do not exist (moved or renamed?): {missing}"


def test_each_other_projects_path_is_still_named_on_its_page():
    """An entry whose page no longer names the path is stale (and would hide a new mention)."""
    stale = [key for key in OTHER_PROJECTS if key[1] not in named_paths((REPO / key[0]).read_text(encoding="utf-8"))]
    assert not stale, stale


@pytest.mark.parametrize(
    "markdown, named",
    [
        ("see `src/megatron/bridge/perf/run.py`", ["src/megatron/bridge/perf/run.py"]),
        ("`perf/run.py` and `config_stages/rules/registry.py`", ["perf/run.py", "config_stages/rules/registry.py"]),
        ("`unit_tests/perf/test_harness_start.py::test_x[a-b]`", ["unit_tests/perf/test_harness_start.py"]),
        ("`recipes/qwen/` and `docs/README.md:12`", ["recipes/qwen", "docs/README.md"]),
        ("`summary.json`, `config.py`, `launch.log`", []),
        ("`DIR/latest_checkpointed_iteration.txt`, `runs/<name>/summary.json`, `docs/benchmarks/*.md`", []),
        ("`uv run python scripts/x.py`, `https://example.org/a.py`, `/tmp/a.py`", []),
        (
            "```bash\nuv run python scripts/performance/run_script.py --config_file recipes/tiny.yaml x/y.py\n```",
            ["scripts/performance/run_script.py", "recipes/tiny.yaml"],
        ),
    ],
    ids=[
        "root-path",
        "relative-paths",
        "test-selector",
        "folder-and-line",
        "bare-names",
        "placeholders",
        "no-single-path",
        "fenced-words",
    ],
)
def test_what_counts_as_a_named_path(markdown, named):
    assert named_paths(markdown) == named


def test_a_moved_file_is_found_missing(tmp_path):
    page = tmp_path / "page.md"
    assert not exists("src/megatron/bridge/training/capture_memory.py", page)
    assert not exists("training/cuda_graphs.py", page)
    assert exists("training/devices/cuda_graphs.py", page) and exists("megatron/core/__init__.py", page)
