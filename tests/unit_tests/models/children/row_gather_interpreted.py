"""Child program: the counted row gather's Triton kernel run by Triton's CPU interpreter.

The parent sets ``TRITON_INTERPRET=1`` (before Triton is imported). Prints one ``REPORT {json}``
line: per case, whether the first ``count`` rows equal ``index_select`` (or the plain copy, without an
index) and whether the rows from ``count`` on were left untouched.
"""

import json

import torch

from megatron.bridge.models.torch_native.row_gather import gather_row_pairs, gather_rows, gather_sum_rows, uses_kernel

SENTINEL = -7


def packed(rows: int, row_words: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Rows of a packed byte buffer seen as ``dtype``: strided rows, as the exchange buffers are."""
    g = torch.Generator().manual_seed(rows * 31 + row_words)
    return torch.randint(-1000, 1000, (rows, row_words), generator=g).to(dtype)


def case(src: torch.Tensor, num_out: int, count, strided_out: bool, indexed: bool = True) -> dict:
    """``count=None``: every row; ``indexed=False``: a plain copy of the first ``num_out`` rows."""
    g = torch.Generator().manual_seed(num_out + (count or 0))
    index = torch.randint(0, src.shape[0], (num_out,), generator=g) if indexed else None
    src = src if indexed else src[:num_out]
    width = src.shape[1]
    if strided_out:
        out = torch.full((num_out, width + 3), SENTINEL, dtype=src.dtype)[:, :width]
    else:
        out = torch.full((num_out, width), SENTINEL, dtype=src.dtype)
    got = gather_rows(src, index, None if count is None else torch.tensor([count]), out)
    live = num_out if count is None else min(count, num_out)
    want = src[:live] if index is None else src.index_select(0, index[:live])
    return dict(
        wrote_in_place=got.data_ptr() == out.data_ptr(),
        first_rows_equal=bool(torch.equal(got[:live], want)),
        rest_untouched=bool((got[live:] == SENTINEL).all()),
    )


CASES = {
    "word_column_of_packed_rows": lambda: case(packed(40, 13)[:, 2:10], 30, 17, strided_out=False),
    "one_float_column_into_a_strided_column": lambda: case(
        packed(25, 16, torch.float32)[:, 5:6], 25, 25, strided_out=True
    ),
    "count_zero_writes_nothing": lambda: case(packed(10, 8), 10, 0, strided_out=False),
    "count_past_the_rows_is_clamped": lambda: case(packed(10, 8), 6, 50, strided_out=False),
    "rows_wider_than_one_column_block": lambda: case(packed(9, 1500, torch.float32), 9, 5, strided_out=True),
    "no_rows": lambda: case(packed(4, 8), 0, 3, strided_out=False),
    "every_row_without_a_count": lambda: case(packed(12, 8)[:, 1:7], 12, None, strided_out=True),
    "plain_copy_of_a_strided_column": lambda: case(packed(30, 12)[:, 4:12], 30, None, strided_out=True, indexed=False),
    "plain_copy_stopping_at_the_count": lambda: case(
        packed(30, 12, torch.uint8)[:, 3:7], 30, 11, strided_out=False, indexed=False
    ),
}


def pair_case(count, indexed: bool) -> dict:
    """Two columns of different widths and dtypes (one into a strided column) in one launch."""
    g = torch.Generator().manual_seed(5)
    rows, num_out = 20, 14
    words, scalars = packed(rows, 12)[:, 2:10], packed(rows, 4, torch.int32)[:, 1:2]
    index = torch.randint(0, rows, (num_out,), generator=g) if indexed else None
    if not indexed:
        words, scalars = words[:num_out], scalars[:num_out]
    out_words = torch.full((num_out, 8), SENTINEL, dtype=torch.int64)
    out_scalars = torch.full((num_out, 3), SENTINEL, dtype=torch.int32)[:, :1]
    gather_row_pairs(
        [(words, out_words), (scalars, out_scalars)], index, None if count is None else torch.tensor([count])
    )
    live = num_out if count is None else min(count, num_out)
    pick = (lambda t: t[:live]) if index is None else (lambda t: t.index_select(0, index[:live]))
    return dict(
        first_rows_equal=bool(
            torch.equal(out_words[:live], pick(words)) and torch.equal(out_scalars[:live], pick(scalars))
        ),
        rest_untouched=bool((out_words[live:] == SENTINEL).all() and (out_scalars[live:] == SENTINEL).all()),
    )


PAIR_CASES = {
    "indexed_stopping_at_the_count": lambda: pair_case(9, indexed=True),
    "indexed_every_row": lambda: pair_case(None, indexed=True),
    "plain_copy_stopping_at_the_count": lambda: pair_case(5, indexed=False),
}


def sum_case(num_rows: int, width: int, num_tokens: int, topk: int, dtype: torch.dtype, strided: bool) -> dict:
    """The gather-sum kernel against torch's gather then sum (fp32 accumulation either way)."""
    g = torch.Generator().manual_seed(num_rows + width)
    rows = torch.randn(num_rows, width + (5 if strided else 0), generator=g).to(dtype)[:, :width]
    pos = torch.randint(0, num_rows, (num_tokens, topk), generator=g)
    got = gather_sum_rows(rows, pos)
    want = rows.float().index_select(0, pos.reshape(-1)).view(num_tokens, topk, width).sum(1).to(dtype)
    return dict(
        shape_ok=tuple(got.shape) == (num_tokens, width),
        max_abs_diff=float((got.float() - want.float()).abs().max()) if got.numel() else 0.0,
    )


SUM_CASES = {
    "top3_fp32": lambda: sum_case(20, 40, 7, 3, torch.float32, strided=False),
    "top8_fp16_wide_rows_in_column_blocks": lambda: sum_case(30, 2500, 5, 8, torch.float16, strided=False),
    "strided_rows": lambda: sum_case(12, 24, 4, 2, torch.float32, strided=True),
    "no_tokens": lambda: sum_case(6, 16, 0, 4, torch.float32, strided=False),
}

report = {
    "uses_kernel": uses_kernel(torch.empty(1, 1)),
    "cases": {name: run() for name, run in CASES.items()},
    "pair_cases": {name: run() for name, run in PAIR_CASES.items()},
    "sum_cases": {name: run() for name, run in SUM_CASES.items()},
}
print("REPORT " + json.dumps(report), flush=True)
