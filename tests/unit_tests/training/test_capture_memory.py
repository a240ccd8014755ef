"""The allocator option that lets a multi-stream capture reuse freed blocks: who decides it, that the
training loop's graph sets it in torch's allocator for the capture and resets it after, and what the
start-up line and ``summary.json`` say."""

import pytest
import torch

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config
from megatron.bridge.training.devices import capture_memory
from megatron.bridge.training.devices.capture_memory import OPTION
from megatron.bridge.training.devices.cuda_graphs import IterationGraph

# environment -> (enabled, set by the loop, words of the reason)
DECISIONS = {
    "nothing set": ({}, (True, True, "training loop")),
    "other options only": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, (True, True, "training loop")),
    "user turns it off": (
        {"PYTORCH_CUDA_ALLOC_CONF": f"expandable_segments:True,{OPTION}:False"},
        (False, False, "PYTORCH_CUDA_ALLOC_CONF"),
    ),
    "user turns it on": ({"PYTORCH_CUDA_ALLOC_CONF": f"{OPTION}:True"}, (True, False, "PYTORCH_CUDA_ALLOC_CONF")),
    "newer variable first": (
        {"PYTORCH_ALLOC_CONF": f"{OPTION}:False", "PYTORCH_CUDA_ALLOC_CONF": f"{OPTION}:True"},
        (False, False, "PYTORCH_ALLOC_CONF"),
    ),
    "newer variable without it hides the older": (
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": f"{OPTION}:False"},
        (True, True, "training loop"),
    ),
    "cudaMallocAsync": ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, (False, False, "cudaMallocAsync")),
}


@pytest.mark.parametrize("case", sorted(DECISIONS))
def test_the_users_explicit_choice_wins_else_the_loop_turns_it_on(case):
    environ, (enabled, set_here, reason) = DECISIONS[case]
    decision = capture_memory.decide(environ)
    assert (decision.enabled, decision.set_here) == (enabled, set_here)
    assert reason in decision.source and OPTION in decision.describe()


@pytest.fixture
def no_allocator_env(monkeypatch):
    for name in capture_memory.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    torch._C._accelerator_setAllocatorSettings(f"{OPTION}:False")


@pytest.fixture
def allocator_settings(monkeypatch) -> list:
    """What the loop hands torch's allocator, in order (each call also reaches torch's real setter).

    Read here rather than from torch: torch 2.11 has the setter but no getter."""
    seen, real = [], capture_memory._setter()

    def recording(settings: str) -> None:
        real(settings)
        seen.append(settings)

    monkeypatch.setattr(capture_memory, "_setter", lambda: recording)
    return seen


@pytest.fixture
def wrapper_without_cuda(monkeypatch):
    """megatron's FullCudaGraphWrapper needs CUDA; its constructor is all ``wrap()`` calls."""
    from megatron.core import full_cuda_graph

    class Wrapper:
        def __init__(self, forward_backward, **kwargs):
            pass

        reset_cuda_graph = staticmethod(lambda wrapper: None)

    monkeypatch.setattr(full_cuda_graph, "FullCudaGraphWrapper", Wrapper)


def _full_iteration_graph() -> IterationGraph:
    model = qwen3_30b_a3b_pretrain_config().model
    model.cuda_graph_impl, model.cuda_graph_warmup_steps = "full_iteration", 2
    return IterationGraph.from_model_config(model)


def test_the_graph_sets_the_option_for_its_capture_and_resets_it(
    no_allocator_env, wrapper_without_cuda, allocator_settings
):
    graph = _full_iteration_graph()
    assert "reused" in graph.describe() and "set by the training loop" in graph.describe()
    graph.wrap(lambda **kw: None, first_iteration=1)
    assert allocator_settings == [f"{OPTION}:True"]
    assert graph.summary(final_iteration=12)["capture_record_stream_reuse"] is True
    graph.release()
    assert allocator_settings == [f"{OPTION}:True", f"{OPTION}:False"]


def test_an_explicit_user_setting_is_left_alone(no_allocator_env, monkeypatch, allocator_settings):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", f"{OPTION}:False")
    graph = _full_iteration_graph()
    assert capture_memory.apply(graph.memory_reuse) == graph.memory_reuse
    capture_memory.undo(graph.memory_reuse)
    assert allocator_settings == []  # the loop never touched torch's allocator
    assert "kept until the capture ends" in graph.describe()
    assert graph.summary(final_iteration=12)["capture_record_stream_reuse"] is False


def test_a_torch_without_the_option_reports_it_off_and_the_graph_still_wraps(
    no_allocator_env, wrapper_without_cuda, monkeypatch
):
    """An older torch rejects the key: the run goes on without it and says so; releasing the graph
    (which ``wrap`` does first, and the run's end does last) never touches the unknown option."""

    def unknown(settings):
        raise ValueError(f"Unrecognized key '{OPTION}' in Accelerator allocator config.")

    monkeypatch.setattr(capture_memory, "_setter", lambda: unknown)
    graph = _full_iteration_graph()
    graph.wrap(lambda **kw: None, first_iteration=1)
    graph.release()
    held = graph.memory_reuse
    assert not held.enabled and not held.applied and f"not in torch {torch.__version__}" == held.source
    assert graph.summary(final_iteration=12)["capture_record_stream_reuse"] is False


def test_no_graph_no_decision():
    model = qwen3_30b_a3b_pretrain_config().model
    graph = IterationGraph.from_model_config(model)
    assert graph.memory_reuse is None and graph.summary(final_iteration=12)["capture_record_stream_reuse"] is None
