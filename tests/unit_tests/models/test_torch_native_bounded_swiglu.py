"""The bounded SwiGLU (``bounded_swiglu.py``): only the first ``count`` rows of a padded expert buffer
are computed, forward and backward, and they equal autograd through the fp32 reference.

The kernels run under Triton's CPU interpreter in a child program (``children/bounded_swiglu_interpreted.py``);
``tests/gpu/test_kernels_cuda.py`` runs them on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHILD = Path(__file__).parent / "children" / "bounded_swiglu_interpreted.py"
CASES = [
    "partial_rows_ffn_not_a_power_of_two",
    "every_row",
    "no_row",
    "count_past_the_rows_is_clamped",
    "ffn_wider_than_one_column_block",
    "bfloat16",
]


@pytest.fixture(scope="module")
def report(run_interpreted_child) -> dict:
    return run_interpreted_child(CHILD)


@pytest.mark.parametrize("name", CASES)
def test_only_the_counted_rows_are_computed_and_they_match_autograd(report, name) -> None:
    assert report["cases"][name] == dict(
        wrote_in_place=True,
        output_equal=True,
        grad_h_equal=True,
        grad_probs_equal=True,
        output_rest_untouched=True,
        grad_probs_rest_zero=True,
    )
