"""Torch-native pieces against references on CPU in fp32: SDPA core attention, grouped GEMMs,
grouped experts vs megatron's ``SequentialMLP``, checkpoint layout, delayed wgrad, spec wiring."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from megatron.bridge.models.torch_native import grouped_gemm
from megatron.bridge.models.torch_native.attention import sdpa_core_attention

ATOL = 1e-5


def _reference_attention(q, k, v, scale, causal, mask=None):
    """Textbook attention on megatron layouts ([s, b, h, d]), GQA by repetition."""
    rep = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) * scale
    if causal:
        sq, sk = scores.shape[-2:]
        mask = torch.triu(torch.ones(sq, sk, dtype=torch.bool), diagonal=1)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    probs = scores.softmax(-1)
    out = torch.einsum("bhst,tbhd->sbhd", probs, v)
    return out.reshape(out.shape[0], out.shape[1], -1)


@pytest.mark.parametrize("nq,nkv", [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_matches_reference_forward_and_grads(nq: int, nkv: int, causal: bool) -> None:
    torch.manual_seed(0)
    s, b, d = 9, 2, 8
    q = torch.randn(s, b, nq, d, requires_grad=True)
    k = torch.randn(s, b, nkv, d, requires_grad=True)
    v = torch.randn(s, b, nkv, d, requires_grad=True)
    mask = None if causal else torch.rand(b, 1, s, s) < 0.3
    if mask is not None:
        mask[..., 0] = False  # every row keeps one key
    scale = 0.37
    out = sdpa_core_attention(q, k, v, causal=causal, scale=scale, attn_mask=mask)
    ref = _reference_attention(q, k, v, scale, causal, mask)
    assert out.shape == (s, b, nq * d)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=1e-5)


def test_sdpa_value_head_dim_may_differ_from_query_dim() -> None:
    q, k = torch.randn(5, 1, 2, 12), torch.randn(5, 1, 2, 12)
    v = torch.randn(5, 1, 2, 8)  # MLA-style: value head dim != query/key head dim
    out = sdpa_core_attention(q, k, v, causal=True, scale=0.3)
    torch.testing.assert_close(out, _reference_attention(q, k, v, 0.3, causal=True), atol=ATOL, rtol=1e-5)


class _CpuBuffer:
    """Stand-in for megatron's global memory buffer (it allocates on the current CUDA device)."""

    def get_tensor(self, shape, dtype, name):
        return torch.empty(shape, dtype=dtype)


def test_sdpa_module_matches_megatron_dot_product_attention(model_parallel, monkeypatch, tiny_moe_config) -> None:
    from megatron.core import parallel_state
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from megatron.bridge.models.torch_native import TorchSDPAttention

    monkeypatch.setattr(parallel_state, "get_global_memory_buffer", lambda: _CpuBuffer())
    config = tiny_moe_config(apply_query_key_layer_scaling=True, attention_softmax_in_fp32=True)
    kwargs = dict(config=config, layer_number=3, attn_mask_type=AttnMaskType.causal, attention_type="self")
    ref_mod, mod = DotProductAttention(**kwargs), TorchSDPAttention(**kwargs)
    # megatron divides by layer_number and multiplies back inside its fp32 softmax
    assert mod.softmax_scale == pytest.approx(ref_mod.softmax_scale * 3)
    s, b = 7, 2
    q = torch.randn(s, b, 4, 16, requires_grad=True)
    k = torch.randn(s, b, 2, 16, requires_grad=True)
    v = torch.randn(s, b, 2, 16, requires_grad=True)
    causal_mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    ref = ref_mod(q, k, v, causal_mask)
    out = mod(q, k, v, causal_mask)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    grad = torch.randn_like(out)
    for g, w in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=1e-5)


def test_sdpa_attention_dropout_is_applied_in_training_only(model_parallel, tiny_moe_config) -> None:
    from megatron.core import tensor_parallel
    from megatron.core.transformer.enums import AttnMaskType

    from megatron.bridge.models.torch_native import TorchSDPAttention

    tensor_parallel.model_parallel_cuda_manual_seed(1, inference_rng_tracker=True, force_reset_rng=True)
    config = tiny_moe_config(attention_dropout=0.5)
    mod = TorchSDPAttention(config, 1, AttnMaskType.causal, "self")
    q, k, v = torch.randn(6, 1, 4, 16), torch.randn(6, 1, 2, 16), torch.randn(6, 1, 2, 16)
    mod.eval()
    torch.testing.assert_close(mod(q, k, v, None), mod(q, k, v, None))
    mod.train()
    assert not torch.allclose(mod(q, k, v, None), mod.eval()(q, k, v, None))


def _backends():
    backends = ["loop"]
    try:  # torch builds with a CPU/fp32 fallback of torch._grouped_mm exercise that path too
        x, w = torch.randn(3, 8), torch.randn(2, 4, 8)
        torch._grouped_mm(x, w.transpose(-2, -1), offs=torch.tensor([1, 3], dtype=torch.int32))
        backends += ["grouped_mm", "grouped_mm_padded"]
    except Exception:
        pass
    return backends


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("counts", [[3, 0, 5, 2], [0, 0, 4, 0], [1, 1, 1, 1]])
def test_grouped_linear_matches_per_expert_matmuls(backend: str, counts: list) -> None:
    torch.manual_seed(0)
    x = torch.randn(sum(counts), 8, requires_grad=True)
    w = torch.randn(len(counts), 12, 8, requires_grad=True)
    tpe = torch.tensor(counts)
    out = grouped_gemm.grouped_linear(x, w, tpe, backend=backend)
    ref = grouped_gemm.reference_grouped_linear(x, w, counts)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    grad = torch.randn_like(out)
    gx, gw = torch.autograd.grad(out, (x, w), grad)
    rx, rw = torch.autograd.grad(ref, (x, w), grad)
    torch.testing.assert_close(gx, rx, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(gw, rw, atol=ATOL, rtol=1e-5)
    for e, n in enumerate(counts):
        if n == 0:
            assert torch.count_nonzero(gw[e]) == 0


def test_unaligned_shapes_fall_back_to_the_loop() -> None:
    x = torch.randn(5, 6, requires_grad=True)
    w = torch.randn(2, 3, 6, requires_grad=True)  # 12-byte rows: not a grouped_mm operand
    out = grouped_gemm.grouped_linear(x, w, torch.tensor([2, 3]), backend="grouped_mm")
    torch.testing.assert_close(out, grouped_gemm.reference_grouped_linear(x, w, [2, 3]))


def test_backend_choice_on_cpu_is_the_loop() -> None:
    assert grouped_gemm.select_backend(torch.zeros(1, dtype=torch.bfloat16)) == "loop"
    assert grouped_gemm.select_backend(torch.zeros(1), "grouped_mm") == "grouped_mm"
    with pytest.raises(ValueError):
        grouped_gemm.select_backend(torch.zeros(1), "cutlass")


def _expert_pair(config):
    """A ``SequentialMLP`` as the plain spec builds it and a ``TorchGroupedMLP`` with its weights."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.process_groups_config import ProcessGroupCollection

    from megatron.bridge.models.torch_native import TorchGroupedMLP

    pgs = ProcessGroupCollection.use_mpu_process_groups()
    plain_builder = LocalSpecProvider().grouped_mlp_modules(True)
    plain = plain_builder(config.num_moe_experts, config, pg_collection=pgs)
    native = TorchGroupedMLP(config.num_moe_experts, config, pg_collection=pgs)
    native.load_state_dict(plain.state_dict(), strict=True)
    return plain, native


@pytest.mark.parametrize("counts", [[5, 0, 3, 4], [0, 7, 0, 1]])
def test_grouped_experts_match_sequential_mlp(model_parallel, counts: list, tiny_moe_config) -> None:
    config = tiny_moe_config()
    plain, native = _expert_pair(config)
    torch.manual_seed(1)
    x = torch.randn(sum(counts), config.hidden_size, requires_grad=True)
    probs = torch.rand(sum(counts), requires_grad=True)
    tpe = torch.tensor(counts)
    ref, _ = plain(x, tpe, probs)
    out, bias = native(x, tpe, probs)
    assert bias is None
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    grad = torch.randn_like(out)
    (ref * grad).sum().backward()
    gx_ref, gp_ref = x.grad.clone(), probs.grad.clone()
    x.grad = probs.grad = None
    (out * grad).sum().backward()
    torch.testing.assert_close(x.grad, gx_ref, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(probs.grad, gp_ref, atol=ATOL, rtol=1e-5)
    for e, expert in enumerate(plain.local_experts):
        torch.testing.assert_close(native.weight1.grad[e], expert.linear_fc1.weight.grad, atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(native.weight2.grad[e], expert.linear_fc2.weight.grad, atol=ATOL, rtol=1e-5)
        if counts[e] == 0:
            assert torch.count_nonzero(native.weight1.grad[e]) == 0


@pytest.mark.parametrize("backend", ["auto", "loop"])
def test_experts_run_the_configured_grouped_gemm_backend(model_parallel, tiny_moe_config, monkeypatch, backend) -> None:
    config = tiny_moe_config()
    config.torch_native_grouped_gemm_backend = backend  # the provider's field
    _, native = _expert_pair(config)
    seen = []
    original = grouped_gemm.select_backend
    monkeypatch.setattr(
        grouped_gemm, "select_backend", lambda x, requested="auto": seen.append(requested) or original(x, requested)
    )
    native(torch.randn(3, config.hidden_size), torch.tensor([1, 2, 0, 0]), torch.rand(3))
    assert seen == [backend, backend]  # fc1 and fc2


def test_expert_parameters_are_marked_for_expert_data_parallel(model_parallel, tiny_moe_config) -> None:
    plain, native = _expert_pair(tiny_moe_config())
    # EP=1 and expert TP == TP: experts reduce over the full DP group, exactly like the plain spec.
    assert {p.allreduce for p in native.parameters()} == {p.allreduce for p in plain.parameters()} == {True}
    assert all(p.tensor_model_parallel for p in native.parameters())
    assert sum(p.numel() for p in native.parameters()) == sum(p.numel() for p in plain.parameters())


def _describe(sharded: dict) -> dict:
    out = {}
    for local_key, sh in sharded.items():
        entry = {"key": sh.key, "replica_id": tuple(sh.replica_id)}
        for attr in ("global_shape", "global_offset", "axis_fragmentations", "local_shape", "prepend_axis_num"):
            if hasattr(sh, attr):
                entry[attr] = tuple(getattr(sh, attr)) if not isinstance(getattr(sh, attr), int) else getattr(sh, attr)
        entry["type"] = type(sh).__name__
        out[local_key] = entry
    return out


def test_sharded_state_dict_layout_equals_sequential_mlp(model_parallel, tiny_moe_config) -> None:
    plain, native = _expert_pair(tiny_moe_config())
    prefix = "decoder.layers.0.mlp.experts."
    want = _describe(plain.sharded_state_dict(prefix, sharded_offsets=((0, 0, 1),)))
    got = _describe(native.sharded_state_dict(prefix, sharded_offsets=((0, 0, 1),)))
    assert got == want
    sh_plain = plain.sharded_state_dict(prefix)
    sh_native = native.sharded_state_dict(prefix)
    for key, sh in sh_plain.items():
        data = getattr(sh, "data", None)
        if isinstance(data, torch.Tensor):
            torch.testing.assert_close(sh_native[key].data, data)


def test_plain_state_dict_loads_and_bad_keys_fail(model_parallel, tiny_moe_config) -> None:
    plain, native = _expert_pair(tiny_moe_config())
    torch.testing.assert_close(native.weight2[1], plain.local_experts[1].linear_fc2.weight)
    sd = plain.state_dict()
    sd.pop("local_experts.3.linear_fc1.weight")
    with pytest.raises(RuntimeError, match="expected experts"):
        native.load_state_dict(sd)


def test_delayed_wgrad_gives_equal_gradients_and_fires_hooks(model_parallel, tiny_moe_config) -> None:
    config = tiny_moe_config()
    _, eager = _expert_pair(config)
    _, delayed = _expert_pair(config)
    delayed.load_state_dict(eager.state_dict())
    delayed.set_delay_wgrad_compute(True)
    fired = []
    delayed.register_wgrad_accumulation_and_reduce_hooks(lambda: fired.append(1))
    counts = torch.tensor([4, 0, 2, 3])
    for step in range(2):  # two micro-batches: accumulation across backward_dw calls
        torch.manual_seed(step)
        x = torch.randn(9, config.hidden_size)
        probs = torch.rand(9)
        for mod in (eager, delayed):
            out, _ = mod(x, counts, probs)
            out.pow(2).sum().backward()
        assert delayed.weight1.grad is None if step == 0 else True
        delayed.backward_dw()
    torch.testing.assert_close(delayed.weight1.grad, eager.weight1.grad, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(delayed.weight2.grad, eager.weight2.grad, atol=ATOL, rtol=1e-5)
    assert fired == [1, 1]
    delayed.backward_dw()  # nothing pending: no-op, no hook
    assert fired == [1, 1]


def test_spec_swaps_only_core_attention_experts_and_norms(model_parallel, tiny_moe_config) -> None:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from megatron.bridge.models.torch_native import (
        TorchGroupedMLP,
        TorchNativeMoELayer,
        TorchSDPAttention,
        get_torch_native_decoder_block_spec,
    )

    config = tiny_moe_config(num_layers=2, moe_layer_freq=[1, 0], qk_layernorm=True)
    local = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    native = get_torch_native_decoder_block_spec(config)
    assert len(native.layer_specs) == 2
    moe, dense = native.layer_specs
    assert moe.submodules.self_attention.submodules.core_attention is TorchSDPAttention
    assert dense.submodules.self_attention.submodules.core_attention is TorchSDPAttention
    assert isinstance(moe.submodules.mlp, functools.partial) and moe.submodules.mlp.func is TorchNativeMoELayer
    assert issubclass(TorchNativeMoELayer, MoELayer)
    assert moe.submodules.mlp.keywords["submodules"].experts.func is TorchGroupedMLP
    dense_local = local.layer_specs[1].submodules.mlp  # dense MLP untouched
    assert (dense.submodules.mlp.func, dense.submodules.mlp.keywords) == (dense_local.func, dense_local.keywords)
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from megatron.bridge.models.torch_native.norm import TorchNativeNorm

    assert local.layer_specs[0].submodules.input_layernorm is WrappedTorchNorm
    attn = moe.submodules.self_attention.submodules
    assert (moe.submodules.input_layernorm, moe.submodules.pre_mlp_layernorm, native.layer_norm) == (
        TorchNativeNorm,
        TorchNativeNorm,
        TorchNativeNorm,
    )
    assert (attn.q_layernorm, attn.k_layernorm) == (TorchNativeNorm, TorchNativeNorm)
    assert attn.linear_qkv is local.layer_specs[0].submodules.self_attention.submodules.linear_qkv
    assert local.layer_specs[0].submodules.mlp.keywords["submodules"].experts.func.__name__ == "SequentialMLP"


@pytest.mark.parametrize(
    "requested,have_te,cuda,expected",
    [
        ("auto", False, True, "torch_native"),
        ("auto", True, True, "torch_native"),
        ("auto", True, False, "torch_native"),
        ("local", False, True, "local"),
        ("torch_native", True, True, "torch_native"),
    ],
)
def test_a_provider_on_its_own_resolves_auto_for_this_machine(
    simulate_host, requested, have_te, cuda, expected
) -> None:
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    simulate_host(gpus=int(cuda), transformer_engine="2.20.2" if have_te else None)
    provider = GPTModelProvider(num_layers=1, hidden_size=8, num_attention_heads=1, layer_spec=requested)
    assert provider.resolved_layer_spec == expected


# ---------------------------------------------------------------------------------------------
# Full tiny model: the plain megatron-core spec vs the torch-native spec, same weights and data.
# Needs the CPU compatibility layer, which patches torch process-wide: run in a child process.

FULL_MODEL_CHILD = Path(__file__).parent / "children" / "torch_native_full_model.py"


@pytest.fixture(scope="module")
def full_model_report(tmp_path_factory, run_child_script) -> dict:
    (report,) = run_child_script(FULL_MODEL_CHILD, tmp_path_factory.mktemp("torch_native"))
    return report


def test_full_model_uses_torch_native_modules(full_model_report: dict) -> None:
    assert full_model_report["experts_type"] == "TorchGroupedMLP"
    assert full_model_report["attn_type"] == "TorchSDPAttention"
    assert full_model_report["dispatcher_type"] == "SortedTokenDispatcher"
    assert full_model_report["model_types"] == ["GPTModel", "TorchNativeLossGPTModel"]
    # Attention projections and the output layer add their weight gradient into main_grad.
    assert full_model_report["linear_types"] == ["MainGradColumnParallelLinear", "MainGradRowParallelLinear"]
    assert full_model_report["plain_linear_types"] == ["ColumnParallelLinear", "RowParallelLinear"]


def test_full_model_forward_and_gradients_match_plain_spec(full_model_report: dict) -> None:
    r = full_model_report
    assert r["loss_native"] == pytest.approx(r["loss_plain"], rel=1e-6, abs=1e-6)
    assert r["grad_keys_equal"] is True
    assert r["grad_max_abs_diff"] <= 1e-5 * max(1.0, r["grad_max_abs"])


def test_short_run_loss_curves_agree(full_model_report: dict) -> None:
    plain, native = full_model_report["curves"]["plain"], full_model_report["curves"]["native"]
    assert len(plain) == len(native) == 6
    assert native == pytest.approx(plain, rel=1e-4, abs=1e-5)
    assert plain[-1] < plain[0]  # it trains


# ---------------------------------------------------------------------------------------------
# EP=2 over gloo on CPU (two processes): megatron's combined-1F1B overlap schedule with the
# torch-native experts, and delayed expert wgrad (backward_dw) inside that schedule. Gradients
# must equal the non-overlapped schedule's.

EP2_CHILD = Path(__file__).parent / "children" / "torch_native_ep2_schedules.py"


@pytest.fixture(scope="module")
def ep2_report(tmp_path_factory, run_child_script) -> dict:
    reports = run_child_script(EP2_CHILD, tmp_path_factory.mktemp("torch_native_ep2"), world_size=2, timeout=400)
    return {"ranks": reports}


@pytest.mark.functional
def test_ep2_overlap_schedule_and_delayed_wgrad_give_equal_gradients(ep2_report: dict) -> None:
    for r in ep2_report["ranks"]:
        assert r["expert_grad_norm"] > 0
        assert r["n_grads"]["overlap_delay_wgrad"] == r["n_grads"]["off"]
        assert r["losses"]["overlap"] == pytest.approx(r["losses"]["off"], abs=1e-6)
        assert r["losses"]["overlap_delay_wgrad"] == pytest.approx(r["losses"]["off"], abs=1e-6)
        assert r["grad_diff_overlap"] <= 1e-6
        assert r["grad_diff_delay"] <= 1e-6


@pytest.mark.functional
def test_ep2_delayed_wgrad_reaches_ddp_main_grads(ep2_report: dict) -> None:
    """With megatron's DDP, deferred expert wgrads still land in (and are reduced from) main_grad."""
    for r in ep2_report["ranks"]:
        assert r["ddp_expert_main_grad_norm"] > 0
        assert r["losses"]["ddp_overlap_delay_wgrad"] == pytest.approx(r["losses"]["ddp_off"], abs=1e-6)
        assert r["grad_diff_ddp_delay"] <= 1e-6


@pytest.mark.functional
def test_ep2_schedule_really_calls_backward_dw(ep2_report: dict) -> None:
    for r in ep2_report["ranks"]:
        assert r["backward_dw_calls"]["overlap_delay_wgrad"] >= 2 * 3  # layers x micro-batches


def test_fused_swiglu_function_matches_the_eager_activation(model_parallel, tiny_moe_config) -> None:
    """The function that CUDA runs through torch.compile computes megatron MLP's activation."""
    from megatron.bridge.models.torch_native import experts as experts_mod

    _, native = _expert_pair(tiny_moe_config())
    h = torch.randn(10, 2 * 24, requires_grad=True)
    probs = torch.rand(10, requires_grad=True)
    want = native._activation_eager(h, probs)
    got = experts_mod._swiglu_probs(h, probs)
    torch.testing.assert_close(got, want)
    assert experts_mod._compiled_swiglu_usable(native.config) in (True, False)
    assert not experts_mod._compiled_swiglu_usable(tiny_moe_config(activation_func=torch.nn.functional.gelu))


# ---------------------------------------------------------------------------------------------
# Sync-free sorted token permutation (EP=1) vs megatron's permute/unpermute and alltoall dispatcher


def _topk_routing(num_tokens: int, num_experts: int, topk: int, idle: tuple = (), seed: int = 0):
    """A top-k routing map (exactly k experts per token) that never picks the ``idle`` experts."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g)
    logits[:, list(idle)] = -1e9
    top = logits.topk(topk, dim=1).indices
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool).scatter_(1, top, True)
    probs = torch.zeros(num_tokens, num_experts).scatter_(1, top, torch.rand(num_tokens, topk, generator=g))
    return routing_map, probs


@pytest.mark.parametrize(
    "num_tokens,num_experts,topk,idle",
    [(13, 4, 2, ()), (16, 8, 3, (0, 5)), (7, 6, 1, (2, 3, 4)), (1, 4, 4, ())],
)
def test_sorted_permutation_matches_megatron_permute_unpermute(num_tokens, num_experts, topk, idle) -> None:
    from megatron.core.transformer.moe.moe_utils import permute, unpermute

    from megatron.bridge.models.torch_native.sorted_permutation import permute_sorted, unpermute_sorted

    routing_map, probs = _topk_routing(num_tokens, num_experts, topk, idle)
    x = torch.randn(num_tokens, 5, dtype=torch.float64)
    xr, xn = x.clone().requires_grad_(), x.clone().requires_grad_()
    pr, pn = probs.clone().double().requires_grad_(), probs.clone().double().requires_grad_()
    ref_tok, ref_probs, ref_map, _, _ = permute(xr, routing_map, probs=pr, num_out_tokens=num_tokens * topk)
    tok, nprobs, state = permute_sorted(xn, routing_map, pn, topk)
    assert torch.equal(tok, ref_tok) and torch.equal(nprobs, ref_probs)
    y = torch.randn_like(ref_tok)  # stand-in expert output, same for both
    ref_out = unpermute(ref_tok * y, ref_map, restore_shape=x.shape, routing_map=routing_map)
    out = unpermute_sorted(tok * y, state)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    g = torch.randn_like(out)
    ((ref_out * g).sum() + (ref_probs * torch.arange(ref_probs.numel())).sum()).backward()
    ((out * g).sum() + (nprobs * torch.arange(nprobs.numel())).sum()).backward()
    torch.testing.assert_close(xn.grad, xr.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(pn.grad, pr.grad, rtol=0, atol=0)
    for e in idle:
        assert not routing_map[:, e].any()


@pytest.fixture()
def no_dtoh_stream(monkeypatch):
    """megatron's alltoall dispatcher makes a CUDA stream at construction; the sorted one never uses it."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    monkeypatch.setattr(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", object())


def _moe_layer_pair(config):
    """Plain ``MoELayer`` (allgather dispatcher: megatron's permute/unpermute, runs on CPU in-process)
    and the torch-native one built from ``config``, with the same weights."""
    import dataclasses

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from megatron.bridge.models.torch_native import get_torch_native_decoder_block_spec

    plain_config = dataclasses.replace(config, moe_token_dispatcher_type="allgather")
    plain_spec = get_gpt_decoder_block_spec(plain_config, use_transformer_engine=False).layer_specs[0].submodules.mlp
    native_spec = get_torch_native_decoder_block_spec(config).layer_specs[0].submodules.mlp
    plain, native = plain_spec(config=plain_config), native_spec(config=config)  # partial(MoELayer, ...)
    native.load_state_dict(plain.state_dict(), strict=True)
    return plain, native


def _moe_stages(layer, x, probs, routing_map):
    """The MoE layer's stage methods in the order megatron's forward and overlap schedule call them
    (the router is skipped: it moves its weight to CUDA, so routing comes from the test)."""
    hidden, p = layer.preprocess(x, probs, routing_map)
    hidden, p = layer.dispatch(hidden, p)
    out, _ = layer.routed_experts_compute(hidden, p)
    return layer.postprocess(layer.combine(out), None)


@pytest.mark.parametrize("topk,idle", [(2, ()), (3, (1,)), (1, (0, 2))])
def test_moe_layer_with_sorted_dispatcher_matches_plain_moe_layer(
    model_parallel, no_dtoh_stream, tiny_moe_config, topk, idle
) -> None:
    from megatron.bridge.models.torch_native import SortedTokenDispatcher

    config = tiny_moe_config(
        moe_token_dispatcher_type="alltoall", moe_router_topk=topk, moe_router_pre_softmax=topk == 1
    )
    plain, native = _moe_layer_pair(config)
    assert isinstance(native.token_dispatcher, SortedTokenDispatcher)
    assert type(plain.token_dispatcher).__name__ == "MoEAllGatherTokenDispatcher"
    routing_map, probs = _topk_routing(12, config.num_moe_experts, topk, idle, seed=topk)
    torch.manual_seed(3)
    x = torch.randn(6, 2, config.hidden_size)
    xp, xn = x.clone().requires_grad_(), x.clone().requires_grad_()
    pp, pn = probs.clone().requires_grad_(), probs.clone().requires_grad_()
    out_p = _moe_stages(plain, xp, pp, routing_map)
    out_n = _moe_stages(native, xn, pn, routing_map)
    assert out_n.shape == x.shape
    torch.testing.assert_close(out_n, out_p, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(out_p)
    (out_p * g).sum().backward()
    (out_n * g).sum().backward()
    torch.testing.assert_close(xn.grad, xp.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pn.grad, pp.grad, rtol=1e-6, atol=1e-6)
    for e, expert in enumerate(plain.experts.local_experts):
        torch.testing.assert_close(native.experts.weight1.grad[e], expert.linear_fc1.weight.grad, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(native.experts.weight2.grad[e], expert.linear_fc2.weight.grad, rtol=1e-6, atol=1e-6)
    for e in idle:  # experts with zero tokens
        assert torch.count_nonzero(native.experts.weight1.grad[e]) == 0


@pytest.mark.parametrize(
    "overrides,blocker",
    [
        ({}, None),
        ({"moe_token_dispatcher_type": "allgather"}, "dispatcher is not alltoall"),
        ({"moe_expert_capacity_factor": 1.0}, "token dropping"),
    ],
)
def test_sorted_dispatcher_only_where_it_is_exact(
    model_parallel, no_dtoh_stream, tiny_moe_config, overrides, blocker
) -> None:
    from megatron.bridge.models.dispatch.sorted_common import fast_path_blockers
    from megatron.bridge.models.torch_native.sorted_dispatcher import SortedTokenDispatcher

    config = tiny_moe_config(**dict({"moe_token_dispatcher_type": "alltoall"}, **overrides))
    blockers = fast_path_blockers(config, ep_size=1, tp_size=1)
    _, native = _moe_layer_pair(config)
    if blocker is None:
        assert blockers == [] and isinstance(native.token_dispatcher, SortedTokenDispatcher)
    else:
        assert any(blocker in b for b in blockers)
        assert not isinstance(native.token_dispatcher, SortedTokenDispatcher)
    assert fast_path_blockers(config, ep_size=2, tp_size=1) == blockers  # EP > 1: the transport decides
    assert fast_path_blockers(config, ep_size=1, tp_size=2) != []


def test_sorted_dispatcher_rejects_a_routing_map_without_exactly_topk(
    model_parallel, no_dtoh_stream, tiny_moe_config
) -> None:
    config = tiny_moe_config(moe_token_dispatcher_type="alltoall")
    _, native = _moe_layer_pair(config)
    routing_map, probs = _topk_routing(4, config.num_moe_experts, config.moe_router_topk)
    routing_map[0] = False
    with pytest.raises(RuntimeError, match="token-expert pairs"):
        native.token_dispatcher.dispatch_preprocess(torch.randn(4, 1, config.hidden_size), routing_map, probs)
