"""``model.moe_chunk_sort=gather``: megatron-core's alltoall dispatcher reorders its chunks by one row
gather, with the same rows, probabilities and gradients as megatron-core's unfused
``sort_chunks_by_idxs``; a build puts the configured sort in place, or megatron-core's back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from megatron.core.transformer.moe import token_dispatcher
from megatron.core.transformer.moe.moe_utils import sort_chunks_by_idxs as megatron_sort

from megatron.bridge.models.dispatch.megatron_alltoall import GATHER_LINE
from megatron.bridge.models.dispatch.path_registry import prepare_dispatch
from megatron.bridge.models.torch_native.chunk_sort import (
    chunk_sort_index,
    current_chunk_sort,
    device_chunk_sort_index,
    host_chunk_sort_index,
    sort_chunks_by_gather,
    use_gather_chunk_sort,
    wrap_megatron_sort,
)


@pytest.fixture
def megatron_dispatcher_module():
    """megatron-core's dispatcher module, its own sort in place before and after the test (the
    install is process-wide)."""
    token_dispatcher.sort_chunks_by_idxs = megatron_sort
    yield token_dispatcher
    token_dispatcher.sort_chunks_by_idxs = megatron_sort


def _layout(ep: int, local: int, max_rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunk sizes as the dispatcher has them after the exchange (source rank major), and both of its
    orders: to local-expert major (dispatch) and back (combine, over the transposed sizes)."""
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, max_rows + 1, (ep, local), generator=generator)
    chunks = torch.arange(ep * local)
    to_expert_major = chunks.reshape(-1, local).T.ravel()
    back = chunks.reshape(local, -1).T.ravel()
    return sizes, to_expert_major, back


def _run(sort, rows: torch.Tensor, probs: torch.Tensor | None, sizes: torch.Tensor, order: torch.Tensor):
    """Output rows, output probabilities and both gradients of one sort (a weighted sum as the loss)."""
    rows = rows.detach().requires_grad_()
    probs = None if probs is None else probs.detach().requires_grad_()
    out, out_probs = sort(rows, sizes, order, probs)
    weights = torch.linspace(-1.0, 2.0, out.shape[0])
    loss = (out.sum(1) * weights).sum() + (0 if out_probs is None else (out_probs * weights).sum())
    loss.backward()
    return out.detach(), out_probs, rows.grad, None if probs is None else probs.grad


@pytest.mark.parametrize(
    "ep,local,max_rows,with_probs",
    [
        (16, 8, 5, True),  # the seed's layout: 128 chunks, dispatch with its probabilities
        (16, 8, 5, False),
        (2, 4, 9, True),
        (4, 2, 0, True),  # nothing received
        (8, 3, 1, False),  # many empty chunks
    ],
)
@pytest.mark.parametrize("direction", ["dispatch", "combine"])
def test_the_gather_gives_megatrons_rows_probabilities_and_gradients(ep, local, max_rows, with_probs, direction):
    sizes, to_expert_major, back = _layout(ep, local, max_rows, seed=ep * 100 + local)
    split, order = (sizes.ravel(), to_expert_major) if direction == "dispatch" else (sizes.T.ravel(), back)
    total = int(split.sum())
    rows = torch.randn(total, 6)
    probs = torch.rand(total) if with_probs else None
    expected = _run(megatron_sort, rows, probs, split, order)
    got = _run(sort_chunks_by_gather, rows, probs, split, order)
    for want, have in zip(expected, got):
        assert (want is None) == (have is None)
        if want is not None:
            assert torch.equal(want, have)


@pytest.mark.parametrize("ep,local", [(16, 8), (2, 4), (3, 1)])
def test_the_index_is_the_same_worked_out_on_the_host_or_on_the_device(ep, local):
    """The host branch (numpy) and the device branch (torch, no host read; run here on CPU tensors)."""
    sizes, order, _ = _layout(ep, local, 7, seed=ep + local)
    rows = int(sizes.sum())
    host = host_chunk_sort_index(sizes.ravel(), order, rows)
    assert torch.equal(host, device_chunk_sort_index(sizes.ravel(), order, rows))
    assert torch.equal(host, chunk_sort_index(sizes.ravel(), order, rows))
    assert sorted(host.tolist()) == list(range(rows))  # a permutation: every input row once


def test_sizes_that_do_not_cover_the_input_are_refused_as_megatron_refuses_them():
    sizes, order, _ = _layout(2, 2, 3, seed=1)
    with pytest.raises(ValueError, match=r"chunk sizes add up to \d+ rows, the input has"):
        sort_chunks_by_gather(torch.zeros(int(sizes.sum()) + 1, 2), sizes.ravel(), order)


def test_the_install_switches_between_the_gather_and_megatrons_sort(megatron_dispatcher_module):
    use_gather_chunk_sort(True)
    installed = megatron_dispatcher_module.sort_chunks_by_idxs
    assert installed.megatron_original is megatron_sort and current_chunk_sort() == "gather"
    use_gather_chunk_sort(True)  # again: still one wrapper around megatron's own
    assert megatron_dispatcher_module.sort_chunks_by_idxs.megatron_original is megatron_sort

    sizes, order, _ = _layout(2, 2, 3, seed=2)
    rows = torch.randn(int(sizes.sum()), 3)
    assert torch.equal(installed(rows, sizes.ravel(), order)[0], megatron_sort(rows, sizes.ravel(), order)[0])

    use_gather_chunk_sort(False)  # the next config of the process: megatron's back
    assert megatron_dispatcher_module.sort_chunks_by_idxs is megatron_sort and current_chunk_sort() == "megatron"


def test_a_fused_sort_still_reaches_megatrons_function():
    calls = []
    wrapper = wrap_megatron_sort(lambda *args, **kwargs: calls.append((len(args), kwargs)) or ("fused", None))
    assert wrapper(torch.zeros(1, 1), torch.ones(1), torch.zeros(1), fused=True) == ("fused", None)
    assert calls == [(3, {"probs": None, "fused": True})]
    sizes, order, _ = _layout(2, 2, 3, seed=3)
    wrapper(torch.randn(int(sizes.sum()), 3), sizes.ravel(), order)  # unfused: the gather, not megatron's
    assert len(calls) == 1


def _model(
    experts: int | None, ep: int, fusion: bool, dispatcher: str = "alltoall", sort: str = "gather", pad: bool = False
) -> SimpleNamespace:
    return SimpleNamespace(
        num_moe_experts=experts,
        expert_model_parallel_size=ep,
        moe_permute_fusion=fusion,
        moe_token_dispatcher_type=dispatcher,
        moe_flex_dispatcher_backend=None,
        moe_pad_expert_input_to_capacity=pad,
        moe_chunk_sort=sort,
    )


@pytest.mark.parametrize(
    "model,torch_native_dispatchers,installs",
    [
        (_model(128, 16, False), [], True),  # megatron's layer specs: every MoE layer runs it
        (_model(128, 16, False), ["megatron"], True),  # a torch-native layer kept megatron's dispatcher
        (_model(128, 16, False), ["sorted"], False),  # the torch-native layers replaced it
        (_model(128, 16, False, sort="megatron"), [], False),  # asked for megatron's own
        (_model(128, 16, True), [], False),  # fused: Transformer Engine's kernel sorts
        (_model(128, 16, False, pad=True), [], False),  # padded to capacity: one transpose, no chunk sort
        (_model(16, 16, False), [], False),  # one local expert: megatron-core sorts nothing
        (_model(None, 1, False), [], False),  # a dense model
        (_model(128, 16, False, "allgather"), [], False),  # the allgather dispatcher has no chunk sort
    ],
)
def test_a_build_puts_the_gather_in_place_only_where_megatrons_dispatcher_sorts_chunks(
    model, torch_native_dispatchers, installs, megatron_dispatcher_module
):
    use_gather_chunk_sort(True)  # left by an earlier config of the same process
    lines = prepare_dispatch(model, torch_native_dispatchers)
    assert lines == ([GATHER_LINE] if installs else [])
    assert current_chunk_sort() == ("gather" if installs else "megatron")
