"""``training/mixed_precision.py`` is the public face of the precision recipes: it keeps every name
scripts import from it, and defines none of them (each lives in its configuration stage)."""

from __future__ import annotations

import ast
import inspect

import pytest

from megatron.bridge.training import mixed_precision as face

RECIPE_FUNCTIONS = (
    "bf16_mixed",
    "fp16_mixed",
    "bf16_with_fp8_delayed_scaling_mixed",
    "fp16_with_fp8_delayed_scaling_mixed",
    "bf16_with_mxfp8_mixed",
    "fp16_with_mxfp8_mixed",
    "bf16_with_fp8_current_scaling_mixed",
    "fp16_with_fp8_current_scaling_mixed",
    "nemotron_h_bf16_with_fp8_current_scaling_mixed",
    "nanov2_bf16_with_fp8_current_scaling_mixed",
    "bf16_with_fp8_subchannel_scaling_mixed",
    "fp16_with_fp8_subchannel_scaling_mixed",
    "bf16_with_nvfp4_mixed",
    "nemotron_3_super_bf16_with_nvfp4_mixed",
)
"""Megatron-Bridge's recipe functions."""

PUBLIC_NAMES = RECIPE_FUNCTIONS + (
    "MixedPrecisionConfig",
    "MixedPrecisionRecipe",
    "MixedPrecisionSetting",
    "MIXED_PRECISION_RECIPES",
    "RecipeTable",
    "UnknownMixedPrecisionError",
    "get_mixed_precision_config",
    "canonical_name",
    "is_known_setting",
    "PRECISION_TARGETS",
    "LEFT_TO_USER",
    "mixed_precision_recipe",
    "precision_value",
    "apply_mixed_precision",
)
"""Every name the module offered when it held the whole topic."""


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_the_face_keeps_the_name(name: str) -> None:
    assert name in face.__all__ and getattr(face, name) is not None


def test_the_face_only_imports_and_lists_its_names() -> None:
    """Docstring, imports and ``__all__``: any definition belongs to a stage of ``config_stages``."""
    tree = ast.parse(inspect.getsource(face))
    docstring, *rest = tree.body
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)
    defined = [
        ast.unparse(node).splitlines()[0]
        for node in rest
        if not isinstance(node, (ast.Import, ast.ImportFrom))
        and not (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"])
    ]
    assert defined == []


@pytest.mark.parametrize("name", RECIPE_FUNCTIONS + ("MixedPrecisionConfig", "get_mixed_precision_config"))
def test_a_public_definition_lives_in_a_configuration_stage(name: str) -> None:
    assert getattr(face, name).__module__.startswith("megatron.bridge.training.config_stages.")
