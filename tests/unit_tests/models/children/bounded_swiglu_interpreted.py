"""Child program: the bounded SwiGLU's Triton kernels run by Triton's CPU interpreter.

The parent sets ``TRITON_INTERPRET=1`` (before Triton is imported). Prints one ``REPORT {json}``
line: per case, whether the first ``count`` rows of the output and of both gradients equal autograd
through the fp32 reference, whether the output rows from ``count`` on were left untouched, and
whether the probability gradients there are zero.
"""

import json

import torch

from megatron.bridge.models.torch_native.bounded_swiglu import bounded_swiglu_probs

SENTINEL = -7.0


def reference(h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    gate, linear = torch.chunk(h.float(), 2, dim=-1)
    return torch.nn.functional.silu(gate) * linear * probs.float().unsqueeze(-1)


def case(rows: int, ffn: int, count: int, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(rows * 7 + ffn + count)
    h = torch.randn(rows, 2 * ffn, generator=g).to(dtype).requires_grad_()
    probs = torch.rand(rows, generator=g).requires_grad_()
    grad = torch.randn(rows, ffn, generator=g).to(dtype)
    out = torch.full((rows, ffn), SENTINEL, dtype=dtype)
    got = bounded_swiglu_probs(h, probs, torch.tensor([count]), out)
    got.backward(grad)
    h_ref, probs_ref = h.detach().clone().requires_grad_(), probs.detach().clone().requires_grad_()
    want = reference(h_ref, probs_ref)
    want.backward(grad.float())
    live = min(count, rows)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype != torch.float32 else dict(rtol=1e-5, atol=1e-5)
    return dict(
        wrote_in_place=got.data_ptr() == out.data_ptr(),
        output_equal=bool(torch.allclose(got[:live].float(), want[:live].to(dtype).float(), **tol)),
        grad_h_equal=bool(torch.allclose(h.grad[:live].float(), h_ref.grad[:live].to(dtype).float(), **tol)),
        grad_probs_equal=bool(torch.allclose(probs.grad[:live], probs_ref.grad[:live], **tol)),
        output_rest_untouched=bool((got[live:] == SENTINEL).all()),
        grad_probs_rest_zero=bool((probs.grad[live:] == 0).all()),
    )


CASES = {
    "partial_rows_ffn_not_a_power_of_two": lambda: case(50, 96, 37, torch.float32),
    "every_row": lambda: case(33, 96, 33, torch.float32),
    "no_row": lambda: case(20, 64, 0, torch.float32),
    "count_past_the_rows_is_clamped": lambda: case(10, 40, 99, torch.float32),
    "ffn_wider_than_one_column_block": lambda: case(19, 300, 11, torch.float32),
    "bfloat16": lambda: case(40, 96, 25, torch.bfloat16),
}

if __name__ == "__main__":
    print("REPORT " + json.dumps({"cases": {name: run() for name, run in CASES.items()}}))
