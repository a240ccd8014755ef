"""The import-time warning filters drop third-party noise by its origin, never a user's same text; a
plain session (a user's own script) drops megatron-core's known log notices the same way."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from megatron.bridge.utils.quiet import KNOWN_LOG_RECORDS, MARK_ENV, SHOW_IMPORT_WARNINGS_ENV, silence_known_warnings

TE_JAX_NOTICE = (
    "Detected a Jax installation but could not find the shared object file for the Transformer Engine "
    "Jax extension library. If this is not intentional, please reinstall Transformer Engine"
)


@pytest.mark.parametrize(
    ("category", "message", "module", "dropped"),
    [
        (RuntimeWarning, TE_JAX_NOTICE, "transformer_engine", True),
        (RuntimeWarning, TE_JAX_NOTICE, "my_training_script", False),
        (UserWarning, "Apex is not installed", "megatron.core.fusions", True),
        (UserWarning, "Apex is not installed", "my_training_script", False),
    ],
)
def test_known_warning_dropped_only_from_its_origin(category, message, module, dropped):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        silence_known_warnings(third_party_only=True)
        warnings.warn_explicit(message, category, filename=f"{module.replace('.', '/')}.py", lineno=1, module=module)
    assert (len(seen) == 0) is dropped, [str(w.message) for w in seen]


CHILD = Path(__file__).with_name("children") / "known_records.py"


@pytest.mark.parametrize("show", [False, True], ids=["plain", "shown"])
def test_a_plain_session_drops_megatron_cores_known_notices_but_never_a_users(show):
    """A user's own script repeats no megatron-core notice per rank (GPTModel deprecation, the mock
    dataset's cache, the rerun state machine, the CPU smoke-mode banner its start-up line says once);
    ``MEGATRON_BRIDGE_SHOW_IMPORT_WARNINGS=1`` shows them."""
    env = {k: v for k, v in os.environ.items() if k not in (SHOW_IMPORT_WARNINGS_ENV, MARK_ENV, "PYTHONWARNINGS")}
    if show:
        env[SHOW_IMPORT_WARNINGS_ENV] = "1"
    proc = subprocess.run([sys.executable, str(CHILD)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    for _, text in KNOWN_LOG_RECORDS:
        assert f"{text} (from the user)" in lines
        assert (f"{text} (from megatron-core)" in lines) is show, proc.stderr
