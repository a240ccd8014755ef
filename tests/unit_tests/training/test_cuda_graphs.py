"""The whole-iteration CUDA graph (``model.cuda_graph_impl="full_iteration"``): its rules (each with a
failing and a passing case) and the run's bookkeeping around megatron-core's capture wrapper.

The capture itself needs a GPU; what a CPU can check is that only sync-free steps are accepted, that
megatron-core accepts what the rules accept, and that a run leaves no graph behind for the next."""

import contextlib
from pathlib import Path

import pytest
from overlap_helpers import set_fields, violated_rule_ids

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config
from megatron.bridge.training.config_stages.rules.cuda_graph_rules import CUDA_GRAPH_RULES
from megatron.bridge.training.devices import capture_memory
from megatron.bridge.training.devices.cuda_graphs import IterationGraph

CAPTURED = {
    "model.cuda_graph_impl": "full_iteration",
    "model.num_layers": 4,  # one GPU holds the 4-layer proxy's state, not the 48-layer model's
    "model.expert_model_parallel_size": 1,
    "model.cuda_graph_warmup_steps": 2,
    "train.train_iters": 12,
    "logger.steady_state_window": [4, 12],
}
"""The EP=1 torch-native MoE step of the 4-layer proxy, captured: what the benchmark runs."""


EP2_NVSHMEM = {
    "model.expert_model_parallel_size": 2,
    "model.torch_native_dispatcher": "sorted",
    "model.torch_native_ep_transport": "nvshmem",
}
"""The EP=2 step whose capture was checked: the sorted dispatcher over the NVSHMEM exchange."""


def _captured(**changes):
    return lambda cfg: set_fields(cfg, {**CAPTURED, **changes})


# rule id -> (mutation that breaks the rule, mutation that satisfies it)
CASES = {
    "cuda-graph-impl-captured": (_captured(**{"model.cuda_graph_impl": "local"}), _captured()),
    "optimizer-graph-not-captured": (_captured(**{"optimizer.optimizer_cuda_graph": True}), _captured()),
    "full-iteration-graph-needs-cuda": (_captured(**{"dist.device": "cpu"}), _captured()),
    "full-iteration-graph-sync-free-moe": (_captured(**{"model.expert_model_parallel_size": 2}), _captured()),
    "full-iteration-graph-needs-nccl": (
        _captured(**{"dist.distributed_backend": "gloo"}),
        _captured(**{"dist.distributed_backend": "nccl"}),
    ),
    "full-iteration-graph-no-pipeline": (_captured(**{"model.pipeline_model_parallel_size": 2}), _captured()),
    "full-iteration-graph-warmup-in-run": (_captured(**{"model.cuda_graph_warmup_steps": 0}), _captured()),
    "full-iteration-capture-outside-steady-window": (_captured(**{"model.cuda_graph_warmup_steps": 3}), _captured()),
}


def _violated_ids(cfg, **facts):
    """Violated rule ids on two ranks (the EP=2 cases' world) unless ``facts`` say otherwise."""
    return violated_rule_ids(CUDA_GRAPH_RULES, cfg, {"te_version": None, "world_size": 2, **facts})


def test_every_rule_has_cases():
    assert set(CASES) == {rule.id for rule in CUDA_GRAPH_RULES}


def test_every_rule_is_on_the_docs_page():
    page = (Path(__file__).parents[3] / "docs" / "training" / "cuda-graphs.md").read_text()
    assert [rule.id for rule in CUDA_GRAPH_RULES if f"`{rule.id}`" not in page] == []


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_negative_case_is_reported(rule_id):
    breaks, _ = CASES[rule_id]
    assert rule_id in _violated_ids(breaks(qwen3_30b_a3b_pretrain_config()))


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_positive_case_passes(rule_id):
    _, satisfies = CASES[rule_id]
    assert rule_id not in _violated_ids(satisfies(qwen3_30b_a3b_pretrain_config()))


@pytest.mark.parametrize(
    "backend,world_size,refused",
    [("gloo", 2, True), ("gloo", 1, False), ("gloo", None, False), ("nccl", 2, False), (None, 2, False)],
)
def test_several_ranks_over_gloo_cannot_be_captured(backend, world_size, refused):
    """gloo's collectives (the data-parallel gradient reduction inside megatron's schedule) run on the
    host; one rank has none, and the world size unknown (no launch yet) leaves it to launch time."""
    cfg = _captured(**{"dist.distributed_backend": backend})(qwen3_30b_a3b_pretrain_config())
    assert ("full-iteration-graph-needs-nccl" in _violated_ids(cfg, world_size=world_size)) is refused


@pytest.mark.parametrize(
    "changes,sync_free",
    [
        ({}, True),  # torch-native sorted dispatcher at EP=1
        ({"model.torch_native_dispatcher": "megatron"}, False),  # dropless megatron: counts read on the host
        ({"model.layer_spec": "local"}, False),  # megatron's layers, megatron's dispatcher
        # megatron's drop-and-pad: fixed shapes, but a host-to-GPU copy in the step (its capture failed)
        ({"model.moe_expert_capacity_factor": 1.0, "model.moe_pad_expert_input_to_capacity": True}, False),
        ({"model.moe_expert_capacity_factor": 1.0}, False),  # dropping: megatron's dispatcher
        ({"model.num_moe_experts": None, "model.moe_router_topk": 2}, True),  # dense
        (EP2_NVSHMEM, True),  # EP > 1: the sorted dispatcher's NVSHMEM exchange keeps split sizes on the GPU
        ({**EP2_NVSHMEM, "model.torch_native_ep_transport": "nccl"}, False),  # split sizes copied to the host
        ({**EP2_NVSHMEM, "model.torch_native_ep_transport": "auto"}, False),  # may fall back to nccl
        ({**EP2_NVSHMEM, "model.torch_native_dispatcher": "auto"}, False),  # auto keeps megatron at EP > 1
        ({**EP2_NVSHMEM, "model.layer_spec": "local"}, False),
    ],
)
def test_only_sync_free_moe_steps_are_captured(changes, sync_free):
    cfg = _captured(**changes)(qwen3_30b_a3b_pretrain_config())
    assert ("full-iteration-graph-sync-free-moe" not in _violated_ids(cfg)) is sync_free


EP2_NVSHMEM_OVERLAP = {
    **EP2_NVSHMEM,
    "comm_overlap.overlap_moe_expert_parallel_comm": True,
    "comm_overlap.delay_wgrad_compute": False,
}
EP2_NVSHMEM_OVERLAP_DELAYED_WGRAD = {**EP2_NVSHMEM_OVERLAP, "comm_overlap.delay_wgrad_compute": True}
"""Delayed expert weight gradients under the graph: checked bit for bit against eager on an H200."""


@pytest.mark.parametrize(
    "changes",
    [{}, EP2_NVSHMEM, EP2_NVSHMEM_OVERLAP, EP2_NVSHMEM_OVERLAP_DELAYED_WGRAD],
    ids=["ep1", "ep2_nvshmem", "ep2_overlap", "ep2_overlap_delayed_wgrad"],
)
def test_megatron_core_accepts_the_captured_config(changes):
    """``validate()`` runs every rule and megatron-core's own checks of the model config."""
    cfg = _captured(**changes)(qwen3_30b_a3b_pretrain_config())
    cfg.validate()
    assert cfg.model.cuda_graph_impl == "full_iteration"
    # delay_wgrad_compute reaches megatron's DDP as well as the model (its hooks differ with it)
    assert (
        cfg.ddp.delay_wgrad_compute
        is cfg.model.delay_wgrad_compute
        is changes.get("comm_overlap.delay_wgrad_compute", False)
    )


@pytest.mark.parametrize("nan_check", [True, False])
def test_the_recipe_nan_check_is_kept_and_moved_out_of_the_graph(nan_check):
    """megatron-core's own training refuses the graph with the NaN check on; here DDP is built without
    its in-backward check and the loop checks after each step's backward, so the recipe's setting stays."""
    from megatron.core.distributed import DistributedDataParallelConfig

    cfg = _captured(**{"ddp.check_for_nan_in_grad": nan_check})(qwen3_30b_a3b_pretrain_config())
    cfg.validate()
    graph = IterationGraph.from_model_config(cfg.model, cfg.ddp.check_for_nan_in_grad)
    ddp = DistributedDataParallelConfig(check_for_nan_in_grad=nan_check, grad_reduce_in_fp32=True)
    built_with = graph.ddp_config(ddp)
    assert graph.checks_grads_after_backward is nan_check
    assert built_with.check_for_nan_in_grad is False and built_with.grad_reduce_in_fp32 is True
    assert ddp.check_for_nan_in_grad is nan_check  # the run's own config is not changed
    assert ("NaN/Inf check after each backward" in graph.describe()) is nan_check
    assert graph.summary(final_iteration=12)["grad_nan_check_after_backward"] is nan_check


def test_without_a_graph_ddp_keeps_its_own_nan_check():
    from megatron.core.distributed import DistributedDataParallelConfig

    ddp = DistributedDataParallelConfig(check_for_nan_in_grad=True)
    graph = _graph(impl="none", nan_check=True)
    assert graph.ddp_config(ddp) is ddp and not graph.checks_grads_after_backward


# ------------------------------------------------------------------------------------------ run bookkeeping


@pytest.fixture
def megatron_graph_state():
    """megatron-core's class-level capture state, restored after the test."""
    from megatron.core import full_cuda_graph
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader

    saved = (
        dict(FullCudaGraphWrapper.cuda_graph),
        dict(FullCudaGraphWrapper.curr_iteration),
        dict(FullCudaGraphWrapper.result),
        StaticBufferLoader.static_buffers,
        full_cuda_graph._shared_graph_pool,
    )
    yield full_cuda_graph
    (
        FullCudaGraphWrapper.cuda_graph,
        FullCudaGraphWrapper.curr_iteration,
        FullCudaGraphWrapper.result,
        StaticBufferLoader.static_buffers,
        full_cuda_graph._shared_graph_pool,
    ) = saved


def _graph(impl="full_iteration", warmup=2, nan_check=False, world=None):
    model = qwen3_30b_a3b_pretrain_config().model
    model.cuda_graph_impl, model.cuda_graph_warmup_steps = impl, warmup
    return IterationGraph.from_model_config(model, nan_check, world)


def test_release_leaves_no_graph_for_the_next_run(megatron_graph_state):
    """A graph, step counter or input buffer left on megatron's classes would make the next
    ``pretrain()`` in the process replay the previous run's graph on the previous run's buffers; a
    stale shared pool handle made the next capture fail inside torch's allocator."""
    wrapper_cls, loader_cls = megatron_graph_state.FullCudaGraphWrapper, megatron_graph_state.StaticBufferLoader
    megatron_graph_state._shared_graph_pool = (0, 1)
    wrapper_cls.cuda_graph["training"] = object()
    wrapper_cls.curr_iteration["training"] = 7
    wrapper_cls.result["training"] = [{"lm loss": 1.0}]
    loader_cls.static_buffers["training"].append({"tokens": None})
    _graph().release()
    assert wrapper_cls.cuda_graph["training"] is None
    assert wrapper_cls.curr_iteration["training"] == 0
    assert wrapper_cls.result["training"] is None
    assert loader_cls.static_buffers == {"training": [], "validation": []}
    assert megatron_graph_state._shared_graph_pool is None


def test_without_a_graph_the_schedule_is_unchanged(megatron_graph_state):
    graph = _graph(impl="none")

    def schedule(**kwargs):
        return []

    assert graph.wrap(schedule, first_iteration=1) is schedule
    with graph.model_build_stream():
        pass
    assert graph.describe().startswith("CUDA graph: none")
    assert graph.summary(final_iteration=12) == dict(
        impl="none",
        warmup_steps=None,
        captured_iteration=None,
        grad_nan_check_after_backward=False,
        capture_record_stream_reuse=None,
    )


@pytest.fixture
def stand_in_wrapper(monkeypatch, megatron_graph_state):
    """megatron's FullCudaGraphWrapper (CUDA only) played on the CPU: eager until the warm-up steps
    are done, then it "captures" (runs the schedule once, recording nothing) and replays (runs
    nothing); ``where[0]`` is the stream code runs on now, ``where[1:]`` the stream of each call."""
    from megatron.bridge.training.devices import cuda_graphs

    where = ["default"]

    @contextlib.contextmanager
    def capture_stream():
        where[0] = "capture"
        yield
        where[0] = "default"

    class Wrapper:
        cuda_graph = {"training": None}

        def __init__(self, forward_backward, cuda_graph_warmup_steps, **kwargs):
            self.forward_backward, self.warmup, self.calls = forward_backward, cuda_graph_warmup_steps, 0

        def __call__(self, *args, **kwargs):
            where.append(where[0])
            self.calls += 1
            if self.calls <= self.warmup + 1:  # eager warm-up, then the capture
                result = self.forward_backward(*args, **kwargs)
                if self.calls > self.warmup:
                    Wrapper.cuda_graph["training"] = "graph"
                return result
            return kwargs["step"]  # a replay runs no Python

        def curr_iter(self, stage):
            return self.calls

        reset_cuda_graph = staticmethod(lambda wrapper: Wrapper.cuda_graph.update(training=None))

    monkeypatch.setattr(cuda_graphs, "_on_capture_stream", capture_stream)
    monkeypatch.setattr(megatron_graph_state, "FullCudaGraphWrapper", Wrapper)
    return where


def test_every_step_runs_on_the_capture_stream_warmup_steps_included(stand_in_wrapper):
    """DDP's gradient-accumulation nodes live on the capture stream; a warm-up step computed on
    another stream makes every weight gradient cross streams and be freed while its accumulation
    may still read it. The wrapped schedule enters the capture stream for every call."""
    step = _graph(warmup=2).wrap(lambda **kw: kw["step"], first_iteration=1)
    assert [step(step=i) for i in range(4)] == [0, 1, 2, 3]  # warm-up, warm-up, capture, replay
    assert stand_in_wrapper == ["default"] + ["capture"] * 4


@pytest.mark.parametrize("warmup", [1, 2, 3])
def test_cached_blocks_go_back_just_before_the_capture_and_only_then(stand_in_wrapper, monkeypatch, warmup):
    """The capture's private pool cannot take the blocks the default pool caches after the warm-up
    steps; releasing them once, right before the capturing call, lets the graph use that memory
    (a release at every step would make each eager step allocate afresh)."""
    from megatron.bridge.training.devices import cuda_graphs

    released_before_step, current = [], [None]
    monkeypatch.setattr(cuda_graphs, "release_cached_blocks", lambda: released_before_step.append(current[0]))
    step = _graph(warmup=warmup).wrap(lambda **kw: kw["step"], first_iteration=1)
    for i in range(warmup + 3):
        current[0] = i
        step(step=i)
    assert released_before_step == [warmup]


def _emulated_world():
    """An emulated world's seam as the loop holds it, its backend state made without a process group."""
    from megatron.bridge.emulation.backend import EmulatedWorld
    from megatron.bridge.emulation.network import network_model
    from megatron.bridge.emulation.training_world import EmulatedTrainingWorld

    world = EmulatedTrainingWorld(0, 16, lambda: network_model("h100_ib400"))
    world.backend = EmulatedWorld(0, 16, world.network())
    return world


def test_an_emulated_world_counts_the_captured_collectives_at_every_replay(stand_in_wrapper):
    """The host issues a captured collective once; the GPU runs it at each replay (the capture
    step replays too), so the emulated world's record counts it per replay, not per issue. The
    graph tells the world the run gives it; each step's record is what the world ends the step with."""
    world = _emulated_world()
    record = world.backend.record
    record.add("dp[16]", "reduce_scatter", 4000, 1e-4, capturing=True)  # an earlier run's graph

    def schedule(step: int) -> int:  # the reduce-scatter is captured in the capture step only
        record.add("dp[16]", "reduce_scatter", 4000, 1e-4, capturing=step == 2)
        return step

    step = _graph(warmup=2, world=world).wrap(schedule, first_iteration=1)
    world.begin_steps()
    for i in range(5):  # warm-up, warm-up, capture, replay, replay
        step(step=i)
        world.end_step(i + 1)
    calls = [s["groups"].get("dp[16]", {}).get("reduce_scatter", {}).get("calls", 0) for s in world.steps]
    assert calls == [1, 1, 1, 1, 1]


def test_a_real_world_counts_nothing_at_a_replay(stand_in_wrapper):
    """Without an emulated world the graph replays as before and nothing is recorded."""
    step = _graph(warmup=1).wrap(lambda **kw: kw["step"], first_iteration=1)
    assert [step(step=i) for i in range(3)] == [0, 1, 2]


@pytest.mark.parametrize(
    "first_iteration,final_iteration,captured",
    [(1, 12, 3), (1, 2, None), (11, 20, 13)],  # a fresh run; stopped before the capture; resumed at 10
)
def test_summary_says_when_the_graph_was_captured(first_iteration, final_iteration, captured, monkeypatch):
    for name in capture_memory.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    graph = _graph(warmup=2)
    graph.first_iteration = first_iteration
    assert graph.summary(final_iteration) == dict(
        impl="full_iteration",
        warmup_steps=2,
        captured_iteration=captured,
        grad_nan_check_after_backward=False,
        capture_record_stream_reuse=True,
    )
    assert "after 2 eager warm-up step(s)" in graph.describe()


@pytest.mark.parametrize("warmup", [None, "two", 0])
def test_a_warmup_that_is_no_step_count_is_reported_once_not_a_crash(warmup):
    cfg = _captured(**{"model.cuda_graph_warmup_steps": warmup})(qwen3_30b_a3b_pretrain_config())
    ids = _violated_ids(cfg)
    assert "full-iteration-graph-warmup-in-run" in ids
    assert "full-iteration-capture-outside-steady-window" not in ids
