"""The torch-native kernels on CUDA against their references (CPU CI reaches them only through
Triton's interpreter or an eager fallback)."""

from __future__ import annotations

import pytest
import torch

from megatron.bridge.models import grad_accumulation_fusion as gaf
from megatron.bridge.models.torch_native import cross_entropy as ce
from megatron.bridge.models.torch_native import row_gather
from megatron.bridge.models.torch_native.grouped_gemm import grouped_linear, reference_grouped_linear, select_backend
from megatron.bridge.models.torch_native.norm import FusedRMSNorm, rms_norm_reference
from megatron.bridge.models.torch_native.wgrad_accumulate import accumulate_grouped_wgrad, accumulate_reference


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


@pytest.mark.parametrize("vocab", [300, 9000, 151936])
def test_triton_cross_entropy_matches_the_torch_backend(vocab, generator):
    logits = (torch.randn(4, 3, vocab, device="cuda", generator=generator) * 4).to(torch.bfloat16)
    target = torch.randint(0, vocab, (4, 3), device="cuda", generator=generator)
    weight = torch.randn(4, 3, device="cuda", generator=generator)
    results = {}
    for backend in ("torch", "triton"):
        x = logits.clone().requires_grad_()
        loss = ce.vocab_parallel_cross_entropy(x, target, backend=backend)
        (loss * weight).sum().backward()
        results[backend] = (loss.detach(), x.grad)
    assert ce.select_backend("cuda") == "triton"
    assert rel(results["triton"][0], results["torch"][0]) < 1e-5
    assert rel(results["triton"][1], results["torch"][1]) < 1e-2  # bf16 gradients


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_gather_copies_the_first_count_rows(dtype, generator):
    src = torch.randn(300, 96, device="cuda", generator=generator).to(dtype)
    index = torch.randperm(300, device="cuda", generator=generator)[:200]
    count = torch.tensor([150], device="cuda")
    out = torch.full((200, 96), -7.0, device="cuda", dtype=dtype)
    assert row_gather.uses_kernel(src)
    row_gather.gather_rows(src, index, count, out=out)
    assert torch.equal(out[:150], src[index[:150]]) and bool((out[150:] == -7.0).all())


def test_gather_sum_equals_gather_then_sum(generator):
    rows = torch.randn(512, 2048, device="cuda", generator=generator).to(torch.bfloat16)
    pos = torch.randint(0, 512, (64, 8), device="cuda", generator=generator)
    acc = rows[pos[:, 0]].float()
    for j in range(1, 8):  # the kernel's order: left to right in fp32, one rounding at the end
        acc += rows[pos[:, j]].float()
    assert torch.equal(row_gather.gather_sum_rows(rows, pos), acc.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_expert_wgrad_kernel_adds_each_experts_rows_into_main_grad(dtype, generator):
    counts = torch.tensor([700, 0, 33, 1290], device="cuda")
    rows = int(counts.sum()) + 5  # padding rows at the end are not any expert's
    dy = torch.randn(rows, 768, device="cuda", generator=generator).to(dtype)
    x = torch.randn(rows, 2048, device="cuda", generator=generator).to(dtype)
    start = torch.randn(4, 768, 2048, device="cuda", generator=generator)
    got, want = start.clone(), start.clone()
    accumulate_grouped_wgrad(dy, x, counts, got)
    accumulate_reference(dy, x, counts, want)
    assert rel(got, want) < 1e-5


@pytest.mark.parametrize("backend", ["grouped_mm", "grouped_mm_padded", "loop"])
def test_grouped_linear_matches_per_expert_matmuls(backend, generator):
    counts = torch.tensor([96, 0, 17, 200], device="cuda")
    x = torch.randn(int(counts.sum()), 256, device="cuda", generator=generator).to(torch.bfloat16)
    weight = torch.randn(4, 128, 256, device="cuda", generator=generator).to(torch.bfloat16) / 16
    dy = torch.randn(x.shape[0], 128, device="cuda", generator=generator).to(torch.bfloat16)
    results = []
    for run in (
        lambda a, w: grouped_linear(a, w, counts, backend),
        lambda a, w: reference_grouped_linear(a, w, counts.tolist()),
    ):
        a, w = x.clone().requires_grad_(), weight.clone().requires_grad_()
        out = run(a, w)
        out.backward(dy)
        results.append((out, a.grad, w.grad))
    assert select_backend(x, "auto") == "grouped_mm"
    for got, want in zip(*results):
        assert rel(got, want) < 1e-2


def test_compiled_rms_norm_matches_the_fp32_reference(generator):
    norm = FusedRMSNorm(2048, eps=1e-6).cuda()
    torch.nn.init.normal_(norm.weight, generator=generator)
    x = torch.randn(4096, 2048, device="cuda", generator=generator).to(torch.bfloat16).requires_grad_()
    out = norm(x)
    ref_x = x.detach().clone().requires_grad_()
    ref = rms_norm_reference(ref_x, norm.weight, 1e-6)
    dy = torch.randn_like(out)
    out.backward(dy)
    ref.backward(dy)
    assert rel(out, ref) < 1e-2 and rel(x.grad, ref_x.grad) < 1e-2


def test_dense_wgrad_kernel_keeps_the_product_in_fp32(generator):
    """``gradient_accumulation_fusion`` without Apex: one cuBLAS GEMM with an fp32 result."""
    assert gaf.addmm_out_dtype_runs("cuda")
    x = torch.randn(8192, 2048, device="cuda", generator=generator).to(torch.bfloat16)
    dy = torch.randn(8192, 4096, device="cuda", generator=generator).to(torch.bfloat16)
    main_grad = torch.randn(4096, 2048, device="cuda", generator=generator)
    want = main_grad.double() + dy.double().t() @ x.double()
    gaf.wgrad_gemm_accum_fp32(x, dy, main_grad)
    assert rel(main_grad, want) < 1e-5


@pytest.mark.parametrize("count", [3000, 0, 4096])
def test_bounded_swiglu_matches_the_compiled_one_on_the_counted_rows(count, generator):
    from megatron.bridge.models.torch_native.bounded_swiglu import bounded_swiglu_probs
    from megatron.bridge.models.torch_native.experts import _swiglu_probs

    rows, ffn = 4096, 768
    h = torch.randn(rows, 2 * ffn, device="cuda", generator=generator).to(torch.bfloat16)
    probs = torch.rand(rows, device="cuda", generator=generator)
    grad = torch.randn(rows, ffn, device="cuda", generator=generator).to(torch.bfloat16)
    results = {}
    for name in ("bounded", "compiled"):
        x, p = h.clone().requires_grad_(), probs.clone().requires_grad_()
        if name == "bounded":
            out = torch.full((rows, ffn), -7.0, device="cuda", dtype=torch.bfloat16)
            y = bounded_swiglu_probs(x, p, torch.tensor([count], device="cuda"), out)
        else:
            y = torch.compile(_swiglu_probs, dynamic=True)(x, p)
        y.backward(grad)
        results[name] = (y.detach(), x.grad, p.grad)
    (y, gx, gp), (ry, rgx, rgp) = results["bounded"], results["compiled"]
    assert bool((y[count:] == -7.0).all()) and bool((gp[count:] == 0).all())
    if count:
        assert rel(y[:count], ry[:count]) < 1e-2 and rel(gx[:count], rgx[:count]) < 1e-2
        assert rel(gp[:count], rgp[:count]) < 1e-3


@pytest.mark.gpu_timing
def test_bounded_swiglu_costs_the_counted_rows_not_the_buffer(generator):
    """At EP=16 the sorted dispatcher's buffer has 16 times the rows routed to this rank."""
    from megatron.bridge.models.torch_native.bounded_swiglu import bounded_swiglu_probs

    rows, ffn = 16 * 32768, 768
    h = torch.randn(rows, 2 * ffn, device="cuda", generator=generator).to(torch.bfloat16)
    probs = torch.rand(rows, device="cuda", generator=generator)

    def seconds(count: int) -> float:
        n = torch.tensor([count], device="cuda")
        bounded_swiglu_probs(h, probs, n)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            bounded_swiglu_probs(h, probs, n)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    assert seconds(rows // 16) < 0.25 * seconds(rows)
