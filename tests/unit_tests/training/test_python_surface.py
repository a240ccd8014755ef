"""What a user meets in Python before training: the error class to catch for any validation
failure, a one-line ``repr`` of a config, and imports that print nothing unless asked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.errors import CommOverlapConfigError, ConfigValidationError


def _layout_only(cfg):
    cfg.model.expert_model_parallel_size = 3  # does not divide the 8 experts


def _overlap_and_layout(cfg):
    _layout_only(cfg)
    cfg.comm_overlap.delay_wgrad_compute = True  # without EP overlap


@pytest.mark.parametrize(
    "break_it, raised",
    [(_layout_only, ConfigValidationError), (_overlap_and_layout, CommOverlapConfigError)],
    ids=["layout-rule-only", "with-an-overlap-prerequisite"],
)
def test_validation_failures_are_caught_as_config_validation_error(break_it, raised):
    cfg = qwen3_moe_tiny_pretrain_config()
    break_it(cfg)
    with pytest.raises(ConfigValidationError) as caught:
        cfg.validate(world_size=6)
    assert type(caught.value) is raised
    assert issubclass(CommOverlapConfigError, ConfigValidationError)


def test_repr_of_a_config_is_one_short_line():
    text = repr(qwen3_moe_tiny_pretrain_config())
    assert "\n" not in text and len(text) < 400, text
    for fact in ("Qwen3MoEModelProvider", "layers=2", "EP1", "bf16_mixed", "ep_overlap=None"):
        assert fact in text, (fact, text)


IMPORT_RECIPE = (
    "import warnings, megatron.bridge.recipes.qwen, megatron.bridge.training.pretrain\n"
    "print(sum(1 for f in warnings.filters if f[1] is not None and 'Apex' in f[1].pattern))\n"
    "warnings.warn('Apex is not installed (a user script says so itself)', UserWarning)"
)
"""Imports a recipe and the training entry, prints how many filters for the TE/Apex notices exist,
then raises the same notice from the user's own code."""


def _import(**env: str) -> tuple[str, int]:
    environ = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "MEGATRON_BRIDGE_SHOW_IMPORT_WARNINGS")
    }
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_RECIPE], env={**environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr, int(proc.stdout.split()[-1])


def test_importing_a_recipe_prints_nothing_unless_asked():
    stderr, filters = _import()
    assert filters > 0 and stderr.count("Warning") == 1, stderr
    assert "a user script says so itself" in stderr, "the filters hide the user's own warnings too"
    stderr, filters = _import(MEGATRON_BRIDGE_SHOW_IMPORT_WARNINGS="1")
    assert filters == 0, "asked to see import warnings, but they are still filtered"
