"""The import-time warning filters drop third-party noise by its origin, never a user's same text."""

from __future__ import annotations

import warnings

import pytest

from megatron.bridge.utils.quiet import silence_known_warnings

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
