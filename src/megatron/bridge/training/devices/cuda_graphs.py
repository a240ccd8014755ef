"""The whole-iteration CUDA graph of a run (``model.cuda_graph_impl="full_iteration"``).

Why: at EP=1 a step of the Qwen3-MoE proxy launches about 7,000 kernels, and the host spends about
as long issuing them as the GPU spends running them, so the GPU waits on Python between kernels. A
graph captured once replays every kernel of the forward and backward with one launch per step.

megatron-core provides the capture (``megatron.core.full_cuda_graph.FullCudaGraphWrapper``: eager
warm-up steps, then one capture, then replays, with the micro-batches copied into static buffers)
and leaves the rest to the training loop, which this module does:

* the DDP wrapper is built on the capture stream: DDP's gradient hooks create the parameters'
  gradient-accumulation nodes, and a node created on another stream makes the backward wait on
  that stream, which a capture cannot do;
* every step's forward+backward runs on that stream too, the eager warm-up steps included: the
  gradient-accumulation nodes run there, and a gradient made on another stream would go back to
  that stream's memory pool when DDP drops it, while its accumulation into ``main_grad`` may still
  be queued (found by ``tests/gpu_checks/stream_checks.py``; torch also warns about the mismatch);
* megatron's RNG tracker is made graph-safe at seeding (``Platform.seed_model_parallel``);
* the wrapper keeps its graph, step counter and input buffers on the class, and the shared memory
  pool in its module, so a run releases them when it ends; otherwise the next ``pretrain()`` in the
  process would replay the previous run's graph, or fail to capture into a freed pool;
* ``ddp.check_for_nan_in_grad`` reads gradient norms on the host inside DDP's end of the backward,
  which a capture cannot contain: DDP is built without it and the loop checks the gradients after
  each step's backward instead (``grad_check.py``);
* a capture spanning the compute and communication streams (EP overlap) lets the allocator reuse
  blocks freed across streams while capturing, else it can need several times the eager step's
  memory (``capture_memory.py``); the blocks the warm-up steps left cached go back to the driver
  just before the capture, so that the graph's private pool can take them;
* in an emulated world the host issues a captured collective once, at the capture: each replay
  tells the world the run trains in (``loop/world.py``), whose record counts the captured
  collectives again (``emulation/record.py``); a real world counts nothing.

The rules that keep the captured step free of host reads are in ``cuda_graph_rules.py``.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.core import full_cuda_graph

from megatron.bridge.training.config_stages.facts import graph_capture
from megatron.bridge.training.devices import capture_memory
from megatron.bridge.training.devices.capture_memory import CaptureMemoryReuse
from megatron.bridge.training.loop.world import CapturedCollectives, RealWorld


@dataclass
class IterationGraph:
    """Whether this run captures its forward+backward, and the bookkeeping around the capture."""

    enabled: bool
    warmup_steps: int
    use_single_mempool: bool
    check_for_nan_in_grad: bool = False
    """The run's ``ddp.check_for_nan_in_grad``."""
    first_iteration: int = 1
    """The first iteration this process trains (after a resume, not 1)."""
    memory_reuse: CaptureMemoryReuse | None = None
    """Whether the capture reuses blocks freed across streams (``capture_memory.py``); None without a graph."""
    world: CapturedCollectives = field(default_factory=RealWorld)
    """The world the run trains in: told when the graph replays, and when a new one will be captured."""
    _wrapper: Any | None = None

    @classmethod
    def from_model_config(
        cls, model_cfg: Any, check_for_nan_in_grad: bool = False, world: CapturedCollectives | None = None
    ) -> IterationGraph:
        enabled = graph_capture.captures_full_iteration(model_cfg)
        return cls(
            enabled=enabled,
            warmup_steps=int(model_cfg.cuda_graph_warmup_steps),
            use_single_mempool=bool(model_cfg.cuda_graph_use_single_mempool),
            check_for_nan_in_grad=bool(check_for_nan_in_grad),
            memory_reuse=capture_memory.decide(os.environ) if enabled else None,
            world=world if world is not None else RealWorld(),
        )

    @property
    def checks_grads_after_backward(self) -> bool:
        """Whether the loop runs the gradient NaN check after each step's forward+backward."""
        return self.enabled and self.check_for_nan_in_grad

    def ddp_config(self, ddp: Any) -> Any:
        """The DDP config megatron builds the wrapper with: without the in-backward NaN check when
        capturing (the loop checks after each step's backward), else ``ddp`` itself."""
        if not self.checks_grads_after_backward:
            return ddp
        moved = copy.copy(ddp)
        moved.check_for_nan_in_grad = False
        return moved

    @property
    def capture_iteration(self) -> int | None:
        """The iteration whose step captures the graph (``None`` without a graph)."""
        return graph_capture.capture_iteration(self.first_iteration, self.warmup_steps) if self.enabled else None

    def model_build_stream(self) -> AbstractContextManager:
        """Where the DDP wrapper is built: the capture stream when capturing, else as usual."""
        if not self.enabled:
            return contextlib.nullcontext()
        return _on_capture_stream()

    def wrap(self, forward_backward: Callable[..., Any], first_iteration: int) -> Callable[..., Any]:
        """megatron's schedule, captured after the warm-up steps when enabled; unchanged otherwise."""
        self.first_iteration = first_iteration
        if not self.enabled:
            return forward_backward

        self.release()  # a graph left by an earlier run in this process must not be replayed
        self.world.forget_graph()
        self.memory_reuse = capture_memory.apply(self.memory_reuse)
        wrapper = self._wrapper = full_cuda_graph.FullCudaGraphWrapper(
            forward_backward, cuda_graph_warmup_steps=self.warmup_steps, use_single_mempool=self.use_single_mempool
        )
        world = self.world

        def on_capture_stream(*args: Any, **kwargs: Any) -> Any:
            if wrapper.curr_iter("training") == self.warmup_steps:  # megatron captures in this call
                release_cached_blocks()
            with _on_capture_stream():
                result = wrapper(*args, **kwargs)
            if wrapper.cuda_graph["training"] is not None:  # captured: this call replayed it
                world.graph_replayed()
            return result

        return on_capture_stream

    def describe(self) -> str:
        """The start-up line."""
        if not self.enabled:
            return "CUDA graph: none (every kernel launched from Python)"
        nan_check = (
            "; gradient NaN/Inf check after each backward, outside the graph"
            if self.checks_grads_after_backward
            else ""
        )
        return (
            f"CUDA graph: whole iteration (megatron-core FullCudaGraphWrapper): forward+backward captured in "
            f"the step after {self.warmup_steps} eager warm-up step(s), replayed after; optimizer eager{nan_check}; "
            f"{self.memory_reuse.describe()}"
        )

    def summary(self, final_iteration: int) -> dict[str, Any]:
        """``summary.json`` ``cuda_graph``: the setting and whether (and when) the capture happened."""
        captured = self.enabled and final_iteration >= self.capture_iteration
        return dict(
            impl=graph_capture.FULL_ITERATION if self.enabled else "none",
            warmup_steps=self.warmup_steps if self.enabled else None,
            captured_iteration=self.capture_iteration if captured else None,
            grad_nan_check_after_backward=self.checks_grads_after_backward,
            capture_record_stream_reuse=self.memory_reuse.enabled if self.enabled else None,
        )

    def release(self) -> None:
        """Drop megatron's class-level graph, step counter and static input buffers."""
        if not self.enabled:
            return

        full_cuda_graph.FullCudaGraphWrapper.reset_cuda_graph(self._wrapper)  # class state; the instance is not read
        full_cuda_graph.StaticBufferLoader.static_buffers = {"training": [], "validation": []}
        # The process-wide memory pool of cuda_graph_use_single_mempool dies with the graph that used
        # it; a capture into its stale handle fails inside torch's allocator (seen on an H200 in the
        # second run of one process), so the next run's capture gets a pool of its own.
        full_cuda_graph._shared_graph_pool = None
        self._wrapper = None
        self.memory_reuse = capture_memory.undo(self.memory_reuse)


def release_cached_blocks() -> None:
    """Hand the allocator's cached, unused blocks back to the driver before the capture.

    The capture allocates from a private pool, which cannot take the blocks the default pool keeps
    cached after the warm-up steps freed them: the graph's activations need fresh memory beside them
    (Qwen3-30B-A3B's 48 layers at emulated EP=16 on an H100: 11.5 GiB cached and unused when the
    capture ran out of memory). The collector runs first: ``train.manual_gc`` turns it off in the loop.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _on_capture_stream():
    """Run the block on megatron's capture stream, ordered after and before the current stream's work."""
    stream = full_cuda_graph.get_shared_capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)
