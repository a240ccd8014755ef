"""The sorted dispatcher with EP > 1: exchange plan, static-buffer exchange, padding rows, and
bitwise agreement with megatron-core's alltoall dispatcher (EP=2 over gloo on CPU, all schedules)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from megatron.bridge.models.dispatch.dispatch_path import DispatchChoice
from megatron.bridge.models.dispatch.path_registry import choose_dispatch
from megatron.bridge.models.torch_native.grouped_gemm import grouped_linear, reference_grouped_linear
from megatron.bridge.models.torch_native.sorted_exchange import exchange_plan
from megatron.bridge.models.torch_native.token_exchange import (
    ROW_ALIGN_BYTES,
    CollectiveExchange,
    column,
    copy_columns,
    row_bytes,
    write_columns,
)

CHILDREN = Path(__file__).parent / "children"


def _naive_plan(all_counts: torch.Tensor, rank: int, local: int):
    """Host reference: the received (source-major) row index of each expert-major row."""
    ep = all_counts.shape[0]
    mine = all_counts[:, rank * local : (rank + 1) * local].tolist()
    source_major = [(s, e, j) for s in range(ep) for e in range(local) for j in range(mine[s][e])]
    expert_major = sorted(source_major, key=lambda t: (t[1], t[0], t[2]))
    position = {t: i for i, t in enumerate(source_major)}
    return [position[t] for t in expert_major]


@pytest.mark.parametrize(
    "counts,rank,local",
    [
        ([[1, 0, 2, 3], [0, 4, 1, 1]], 0, 2),
        ([[1, 0, 2, 3], [0, 4, 1, 1]], 1, 2),
        ([[0, 0, 0, 0], [2, 2, 0, 0]], 1, 2),  # nothing for this rank
        ([[3, 1, 0, 2], [0, 2, 1, 1], [5, 0, 0, 3], [1, 1, 2, 0]], 2, 1),  # four ranks, one expert each
        ([[2, 0, 1, 4, 0, 3], [1, 1, 1, 1, 1, 1]], 0, 3),
    ],
)
def test_exchange_plan_matches_a_host_reference(counts, rank, local) -> None:
    all_counts = torch.tensor(counts)
    total = int(all_counts[:, rank * local : (rank + 1) * local].sum())
    capacity = total + 5
    plan = exchange_plan(all_counts, rank, local, capacity=capacity, send_rows=int(all_counts[rank].sum()))
    assert plan.to_source_major[:total].tolist() == _naive_plan(all_counts, rank, local)
    assert plan.to_source_major[total:].tolist() == list(range(total, capacity))  # padding stays put
    assert plan.to_expert_major[plan.to_source_major].tolist() == list(range(capacity))
    ep = all_counts.shape[0]
    assert plan.send_splits.tolist() == all_counts[rank].view(ep, local).sum(1).tolist()
    assert plan.recv_splits.tolist() == all_counts[:, rank * local : (rank + 1) * local].sum(1).tolist()
    assert plan.tokens_per_expert.tolist() == all_counts[:, rank * local : (rank + 1) * local].sum(0).tolist()


BUDGET_COUNTS = [[1, 0, 2, 3], [0, 4, 1, 1]]  # rank 0 receives 1 + 4 = 5 rows, rank 1 receives 5 + 2 = 7


@pytest.mark.parametrize("rank, expert_rows", [(0, 5), (0, 7), (1, 7), (1, 9)])
def test_a_budget_at_or_above_what_arrives_holds_every_row_in_megatrons_order(rank, expert_rows) -> None:
    all_counts = torch.tensor(BUDGET_COUNTS)
    total = int(all_counts[:, rank * 2 : (rank + 1) * 2].sum())
    plan = exchange_plan(all_counts, rank, 2, capacity=12, send_rows=6, expert_rows=expert_rows)
    assert plan.expert_rows == expert_rows and plan.to_source_major.numel() == expert_rows
    assert plan.to_source_major[:total].tolist() == _naive_plan(all_counts, rank, 2)
    assert plan.to_source_major[total:].tolist() == list(range(total, expert_rows))
    assert plan.to_expert_major[plan.to_source_major].tolist() == list(range(expert_rows))
    assert plan.to_expert_major.numel() == 12 and int(plan.to_expert_major.max()) < expert_rows
    assert int(plan.held_total) == int(plan.recv_total) == total
    assert plan.tokens_per_expert.tolist() == all_counts[:, rank * 2 : (rank + 1) * 2].sum(0).tolist()
    assert int(plan.peak_rows) == 7  # the most any rank receives, the same on every rank


@pytest.mark.parametrize("expert_rows, held_per_expert", [(6, [3, 3]), (3, [3, 0]), (1, [1, 0])])
def test_past_the_budget_the_experts_hold_the_first_rows_and_every_index_stays_in_bounds(
    expert_rows, held_per_expert
) -> None:
    """Rank 1 receives 7 rows (2 + 1 for its first expert, 3 + 1 for its second): the experts hold the
    first ``expert_rows`` in megatron's order, the rest name held rows, and the peak says 7."""
    all_counts = torch.tensor(BUDGET_COUNTS)
    plan = exchange_plan(all_counts, 1, 2, capacity=12, send_rows=6, expert_rows=expert_rows)
    assert plan.to_source_major.tolist() == _naive_plan(all_counts, 1, 2)[:expert_rows]
    assert plan.tokens_per_expert.tolist() == held_per_expert
    assert int(plan.held_total) == expert_rows and int(plan.recv_total) == 7 and int(plan.peak_rows) == 7
    assert int(plan.to_expert_major.min()) >= 0 and int(plan.to_expert_major.max()) < expert_rows
    assert plan.recv_splits.tolist() == [5, 2]  # the exchange itself is unchanged: its buffers hold the worst case


@pytest.mark.parametrize(
    "columns",
    [[(32, torch.bfloat16), (1, torch.float32)], [(7, torch.float32)], [(2048, torch.bfloat16), (1, torch.float32)]],
)
def test_packed_rows_are_64_byte_multiples_and_columns_round_trip(columns) -> None:
    nbytes = row_bytes(columns)
    assert nbytes % ROW_ALIGN_BYTES == 0 and nbytes >= sum(
        w * torch.empty((), dtype=d).element_size() for w, d in columns
    )
    buf = torch.zeros(3, nbytes, dtype=torch.uint8)
    offset = 0
    for width, dtype in columns:
        value = torch.randn(3, width).to(dtype)
        view = column(buf, offset, width, dtype)
        view.copy_(value)
        assert torch.equal(column(buf, offset, width, dtype), value)
        offset += width * value.element_size()


@pytest.mark.parametrize(
    "columns",
    [
        [(32, torch.bfloat16), (1, torch.float32)],  # 8-byte words for the tokens, 4-byte for the prob
        [(3, torch.bfloat16)],  # 6 bytes: 2-byte words
        [(2, torch.int64), (16, torch.float16), (5, torch.uint8)],  # three columns: two launches
        [(16, torch.float32)],  # the whole 64-byte row
    ],
)
@pytest.mark.parametrize("ordered", [False, True])
def test_packing_and_reading_with_an_order_gathers_as_it_copies(columns, ordered) -> None:
    """``write_columns``/``copy_columns`` with ``order`` equal the plain copy of the reordered rows."""
    torch.manual_seed(0)
    rows = 6
    order = torch.randperm(rows) if ordered else None
    sources = [(torch.randn(rows, width) * 50).to(dtype) for width, dtype in columns]
    buf = torch.zeros(rows + 2, row_bytes(columns), dtype=torch.uint8)
    write_columns(buf, sources, order)
    read_order = torch.randperm(rows + 2)
    copies = copy_columns(buf, columns, read_order)
    offset = 0
    for src, copy in zip(sources, copies):
        packed = column(buf, offset, src.shape[1], src.dtype)
        assert torch.equal(packed[:rows], src if order is None else src[order])
        assert torch.equal(copy, packed[read_order])
        offset += src.shape[1] * src.dtype.itemsize


@pytest.mark.parametrize("counts,tail", [([3, 0, 5], 4), ([2, 2], 0), ([0, 0, 0], 6)])
def test_grouped_linear_ignores_padding_rows(counts, tail) -> None:
    torch.manual_seed(0)
    valid = sum(counts)
    x = torch.randn(valid + tail, 8, requires_grad=True)
    w = torch.randn(len(counts), 6, 8, requires_grad=True)
    y = grouped_linear(x, w, torch.tensor(counts))
    assert y.shape == (valid + tail, 6)
    assert torch.count_nonzero(y[valid:]) == 0
    ref = reference_grouped_linear(x[:valid], w, counts)
    torch.testing.assert_close(y[:valid], ref)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    xr, wr = x.detach()[:valid].clone().requires_grad_(), w.detach().clone().requires_grad_()
    (reference_grouped_linear(xr, wr, counts) * g[:valid]).sum().backward()
    torch.testing.assert_close(w.grad, wr.grad)
    torch.testing.assert_close(x.grad[:valid], xr.grad)


class _Config:
    """The config fields :func:`choose_dispatch` reads."""

    def __init__(self, **overrides):
        self.torch_native_dispatcher = "auto"
        self.torch_native_ep_transport = "auto"
        self.moe_token_dispatcher_type = "alltoall"
        self.moe_expert_capacity_factor = None
        self.moe_pad_expert_input_to_capacity = False
        self.moe_router_padding_for_quantization = False
        self.moe_shared_expert_overlap = False
        self.moe_latent_size = None
        self.cuda_graph_impl = "none"
        self.transformer_impl = "local"
        self.pipeline_model_parallel_size = 1
        self.__dict__.update(overrides)


@pytest.mark.parametrize(
    "requested,ep,overrides,expected",
    [
        ("auto", 1, {}, ("sorted", "none", True)),
        ("auto", 1, {"cuda_graph_impl": "full_iteration"}, ("sorted", "none", True)),  # captured as it is
        ("auto", 2, {}, ("megatron", None, False)),  # EP > 1: megatron's measured faster
        ("auto", 2, {"torch_native_ep_transport": "nccl"}, ("sorted", "collective", False)),
        ("sorted", 2, {}, ("sorted", "collective", False)),
        ("megatron", 1, {}, ("megatron", None, False)),
        ("auto", 1, {"moe_token_dispatcher_type": "allgather"}, ("megatron", None, False)),
        ("auto", 2, {"pipeline_model_parallel_size": 2}, ("megatron", None, False)),
    ],
)
def test_dispatch_choice_on_cpu(requested, ep, overrides, expected) -> None:
    choice = choose_dispatch(_Config(torch_native_dispatcher=requested, **overrides), ep, 1, None, torch.device("cpu"))
    assert isinstance(choice, DispatchChoice)
    dispatcher, transport, sync_free = expected
    assert (choice.dispatcher, choice.sync_free) == (dispatcher, sync_free)
    if transport is not None:
        assert choice.transport == transport
    assert choice.reason and choice.dispatcher in choice.describe() or "megatron-core" in choice.describe()


@pytest.mark.parametrize(
    "requested, ep, says",
    [("sorted", 2, True), ("sorted", 1, False), ("megatron", 2, False)],  # EP=1 exchanges nothing
)
def test_the_start_up_line_says_the_sorted_dispatchers_budget_where_it_holds_one(requested, ep, says) -> None:
    config = _Config(torch_native_dispatcher=requested, torch_native_rank_capacity_factor=1.5)
    choice = choose_dispatch(config, ep, 1, None, torch.device("cpu"))
    assert ("experts hold a budget of 1.5 x tokens x top-k rows" in choice.describe()) == says


@pytest.mark.parametrize("device,graphed", [("cpu", False), ("cuda", True)])
def test_start_up_line_says_where_the_sorted_indices_replay_from_a_cuda_graph(device, graphed) -> None:
    choice = choose_dispatch(_Config(), 1, 1, None, torch.device(device))
    assert choice.dispatcher == "sorted" and choice.index_graph is graphed
    assert ("indices from a CUDA graph" in choice.describe()) is graphed
    assert choice.to_dict()["index_graph"] is graphed


@pytest.mark.parametrize(
    "overrides,blocker",
    [({"moe_expert_capacity_factor": 1.0}, "token dropping"), ({"cuda_graph_impl": "local"}, "per-layer CUDA graphs")],
)
def test_sorted_request_that_cannot_be_exact_is_an_error(overrides, blocker) -> None:
    with pytest.raises(ValueError, match=blocker):
        choose_dispatch(_Config(torch_native_dispatcher="sorted", **overrides), 2, 1, None, torch.device("cpu"))


@pytest.fixture(scope="module", params=[2, 4], ids=lambda ep: f"ep{ep}")
def ep_sorted_report(request, tmp_path_factory, run_child_script) -> list:
    """The child's reports at EP 2 and at EP 4 (where the NVSHMEM exchange makes three calls, each
    with its own precomputed rows, and packs four regions)."""
    workdir = tmp_path_factory.mktemp(f"ep{request.param}_sorted")
    return run_child_script(CHILDREN / "ep_sorted_dispatch.py", workdir, world_size=request.param, timeout=600)


@pytest.mark.functional
@pytest.mark.parametrize(
    "variant",
    [
        "sorted",
        "sorted_overlap",
        "sorted_overlap_delay_wgrad",
        "sorted_nvshmem_emulated",
        "sorted_nvshmem_emulated_overlap",
        "sorted_budget",
        "sorted_budget_overlap",
        "sorted_nvshmem_emulated_budget",
    ],
)
def test_sorted_dispatcher_equals_megatron_dispatcher(ep_sorted_report, variant) -> None:
    for rank in ep_sorted_report:
        assert rank["sorted_layers"][variant] == 2 and rank["sorted_layers"]["megatron"] == 0
        # the experts behind a worst-case receive buffer skip its padding rows in the activation too
        assert rank["padded_layers"][variant] == 2 and rank["padded_layers"]["megatron"] == 0
        assert rank["expert_grad_norm"] > 0
        assert rank["losses"][variant] == rank["losses"]["megatron"]
        assert rank["grad_diff"][variant] == 0.0
        transports = {c["dispatcher"]: c["transport"] for c in rank["choices"]}
        assert transports["sorted"] == "collective"
        # every deferred expert weight gradient is computed within its step: none is left for the next
        # one (which, replayed from a CUDA graph, would read the previous step's freed tensors)
        assert rank["deferred_wgrads_left"][variant] == 0
        if "nvshmem" in variant:  # the dispatcher precomputed the exchange's per-call rows (both routes)
            assert rank["precomputed_call_rows"] > 0
        if "budget" in variant:  # within a budget of 1.5 x the balanced 16 tokens x top-3 = 48 rows
            peak, budget, balanced = rank["step_peak"][variant]
            assert (budget, balanced) == (72, 48) and balanced <= peak <= budget
        else:
            assert rank["step_peak"][variant] is None  # no budget: nothing kept, nothing read


@pytest.mark.functional
@pytest.mark.parametrize("variant", ["sorted_over_budget", "sorted_nvshmem_emulated_over_budget"])
def test_over_its_budget_the_sorted_dispatcher_stays_finite_and_reports_the_peak(ep_sorted_report, variant) -> None:
    """Half a balanced rank's rows: every micro-batch overflows. The step computes finite values from
    the rows held (nothing written out of bounds) and the peak, the same on every rank, stops it."""
    peaks = {tuple(rank["step_peak"][variant]) for rank in ep_sorted_report}
    assert len(peaks) == 1
    ((peak, budget, balanced),) = peaks
    assert budget == 24 and balanced == 48 and peak >= balanced > budget
    for rank in ep_sorted_report:
        assert rank["finite"][variant] and all(math.isfinite(loss) for loss in rank["losses"][variant])


def test_compiled_exchange_plan_equals_the_eager_one() -> None:
    from megatron.bridge.models.torch_native.sorted_exchange import _plan_tensors

    counts = torch.tensor([[1, 0, 2, 3], [0, 4, 1, 1]])
    compiled = torch.compile(_plan_tensors, dynamic=False)
    for rank in (0, 1):
        for got, want in zip(compiled(counts, rank, 2, 12, 9), _plan_tensors(counts, rank, 2, 12, 9)):
            assert torch.equal(got, want)


def test_auto_with_several_ep_ranks_keeps_megatron_even_where_nvshmem_runs(monkeypatch) -> None:
    from megatron.bridge.models.torch_native import symmetric_exchange
    from megatron.bridge.models.torch_native.symmetric_exchange import SymmetricMemorySupport

    monkeypatch.setattr(
        symmetric_exchange, "symmetric_memory_support", lambda g, d: SymmetricMemorySupport(True, "NVSHMEM available")
    )
    auto = choose_dispatch(_Config(), 2, 1, None, torch.device("cuda"))
    assert auto.dispatcher == "megatron" and "measured faster" in auto.reason
    chosen = choose_dispatch(_Config(torch_native_dispatcher="sorted"), 2, 1, None, torch.device("cuda"))
    assert (chosen.dispatcher, chosen.transport, chosen.sync_free) == ("sorted", "nvshmem", True)


class _RecordingStream:
    """Stands in for the current CUDA stream: records the events it is told to wait on."""

    def __init__(self) -> None:
        self.waited: list = []

    def wait_event(self, event) -> None:
        self.waited.append(event)

    def record_event(self):
        return object()


@pytest.mark.parametrize(
    "recorded_in_capture,waiting_in_capture,same_stream,waits",
    [
        (False, False, False, True),  # eager after eager on another stream: ordered by the event
        (False, False, True, False),  # on the same stream, stream order suffices: no wait to issue
        (True, True, False, True),  # inside one capture: ordered (part of the graph)
        (False, True, False, False),  # first exchange of a capture after an eager step: CUDA refuses that wait
        (True, False, False, False),  # an eager step (a later run in the process) after a captured one
    ],
)
def test_exchanges_wait_only_on_events_of_other_streams_and_the_same_capture_state(
    gloo_world, monkeypatch, recorded_in_capture, waiting_in_capture, same_stream, waits
):
    previous, current = _RecordingStream(), _RecordingStream()
    if same_stream:
        current = previous
    capturing = [recorded_in_capture]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    exchange = CollectiveExchange(dist.group.WORLD)
    exchange._record_done((previous, recorded_in_capture))
    capturing[0] = waiting_in_capture
    assert exchange._wait_previous(SimpleNamespace(is_cuda=True, device=None)) == (current, waiting_in_capture)
    assert (current.waited == [exchange._last_done[0]]) is waits


def test_a_plans_four_exchanges_copy_its_splits_to_the_host_once(gloo_world, monkeypatch) -> None:
    """A transport with host split sizes waits for the GPU once per micro-batch and layer: the
    dispatch, the combine and both backwards share one device-to-host copy of the plan's splits."""
    all_counts = torch.tensor([[2, 1, 3, 0]])
    plan = exchange_plan(all_counts, 0, 4, capacity=8, send_rows=6)
    copies = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: copies.append(self.shape) or tolist(self))
    exchange = CollectiveExchange(dist.group.WORLD)
    rows = torch.arange(12, dtype=torch.float32).view(6, 2)
    for route in [plan.to_experts(), plan.to_tokens(), plan.to_tokens(), plan.to_experts()]:
        received = exchange.exchange([rows], route, lambda recv: recv.clone())
        assert received.shape[0] == route.recv_rows
    assert len(copies) == 1
    assert plan.to_experts().host_splits() == ([6], [6]) and plan.to_tokens().host_splits() == ([6], [6])
