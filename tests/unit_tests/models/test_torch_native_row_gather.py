"""The counted row gather used by the EP sorted dispatcher's exchange: its Triton kernel (under
Triton's CPU interpreter) and the ``index_select`` it falls back to elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron.bridge.models.torch_native.row_gather import gather_rows, gather_sum_rows

CHILD = Path(__file__).parent / "children" / "row_gather_interpreted.py"
CASES = [
    "word_column_of_packed_rows",
    "one_float_column_into_a_strided_column",
    "count_zero_writes_nothing",
    "count_past_the_rows_is_clamped",
    "rows_wider_than_one_column_block",
    "no_rows",
    "every_row_without_a_count",
    "plain_copy_of_a_strided_column",
    "plain_copy_stopping_at_the_count",
]


@pytest.fixture(scope="module")
def interpreted_report(run_interpreted_child) -> dict:
    return run_interpreted_child(CHILD)


def test_the_interpreter_runs_the_kernel(interpreted_report) -> None:
    assert interpreted_report["uses_kernel"] is True


@pytest.mark.parametrize("name", CASES)
def test_kernel_copies_the_first_count_rows_and_leaves_the_rest(interpreted_report, name) -> None:
    assert interpreted_report["cases"][name] == dict(wrote_in_place=True, first_rows_equal=True, rest_untouched=True)


@pytest.mark.parametrize(
    "name", ["indexed_stopping_at_the_count", "indexed_every_row", "plain_copy_stopping_at_the_count"]
)
def test_one_launch_copies_two_columns_with_the_same_rows(interpreted_report, name) -> None:
    """The dispatch's token and prob columns: different widths and dtypes, one index and count."""
    assert interpreted_report["pair_cases"][name] == dict(first_rows_equal=True, rest_untouched=True)


@pytest.mark.parametrize("name", ["top3_fp32", "top8_fp16_wide_rows_in_column_blocks", "strided_rows", "no_tokens"])
def test_gather_sum_kernel_equals_gather_then_sum(interpreted_report, name) -> None:
    """Each token's ``k`` rows summed in fp32 and rounded once, as torch's sum over the gathered copy."""
    assert interpreted_report["sum_cases"][name] == dict(shape_ok=True, max_abs_diff=0.0)


def test_cpu_fallback_is_index_select_or_a_copy_over_every_row() -> None:
    """Without the kernel (plain CPU) every row is copied; the first ``count`` agree with the kernel's."""
    src = torch.arange(24, dtype=torch.int64).view(6, 4)
    index = torch.tensor([5, 0, 3])
    assert torch.equal(gather_rows(src, index, torch.tensor([1])), src[index])
    assert torch.equal(gather_rows(src[:, 1:3], count=torch.tensor([2])), src[:, 1:3])


def test_cpu_gather_sum_sums_each_tokens_rows() -> None:
    rows = torch.arange(12, dtype=torch.float32).view(4, 3)
    pos = torch.tensor([[0, 3], [2, 2]])
    assert torch.equal(gather_sum_rows(rows, pos), torch.stack([rows[0] + rows[3], rows[2] + rows[2]]))


def test_mismatched_output_is_refused() -> None:
    with pytest.raises(ValueError, match="gather_rows"):
        gather_rows(torch.zeros(4, 3), torch.tensor([0, 1]), torch.tensor([2]), out=torch.zeros(3, 3))


def test_a_counted_copy_writes_the_counted_rows_and_passes_the_gradient_through() -> None:
    from megatron.bridge.models.torch_native.row_gather import copy_counted_rows

    src = torch.randn(12, 5, requires_grad=True)
    out = copy_counted_rows(src, torch.tensor([7]))
    assert out.shape == src.shape and out.data_ptr() != src.data_ptr()
    assert torch.equal(out[:7], src[:7].detach())
    grad = torch.randn(12, 5)
    out.backward(grad)
    assert torch.equal(src.grad, grad)
