"""Every pytest mark the tests use is registered in ``pyproject.toml``: pytest warns about an unknown
one (``PytestUnknownMarkWarning: Unknown pytest.mark.gpu``) on every run that collects it, and
``--strict-markers`` makes that an error."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}
_MARK = re.compile(r"pytest\.mark\.([A-Za-z_]\w*)")


def _registered() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    markers = config["tool"]["pytest"]["ini_options"].get("markers", [])
    return {line.split(":", 1)[0].strip() for line in markers}


def test_every_mark_the_tests_use_is_registered():
    used = {name for path in (ROOT / "tests").rglob("*.py") for name in _MARK.findall(path.read_text())}
    assert used - BUILT_IN - _registered() == set()


def test_pytest_accepts_the_gpu_mark_with_strict_markers(tmp_path):
    """pytest itself, with the project's configuration, on a test marked as ``tests/gpu``'s are."""
    (tmp_path / "test_marked.py").write_text("import pytest\n\n\n@pytest.mark.gpu\ndef test_marked():\n    pass\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--strict-markers",
            "-W",
            "error::pytest.PytestUnknownMarkWarning",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(ROOT),
            str(tmp_path / "test_marked.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
