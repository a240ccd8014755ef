"""The sorted dispatchers' index computations, replayed from CUDA graphs.

Why: before any token moves, a sorted dispatcher turns the routing map into indices (a top-k, two
sorts, a scatter, a few gathers) and, with several EP ranks, the gathered counts into an exchange
plan (cumulative sums, a search, a scatter). That is about twenty small kernels on static shapes
whose launches cost the host far more than the GPU spends on them (measured:
``docs/benchmarks/implementation_costs.md``). A step whose host is slower
than its GPU leaves the GPU idle and gives the EP-overlap schedule nothing queued to hide the
all-to-all under.

:class:`GraphedIndexFunction` captures such a function once per input shape (and CUDA stream) and
afterwards enqueues it as a copy per input into the graph's static buffers, one replay and one copy
of its flat output buffer out. The
copy out is needed because the next replay overwrites the buffer while each micro-batch keeps its
indices until its backward. The replay runs the very kernels the eager function runs, so the
results are identical.

It runs the function eagerly where a graph cannot or need not be used: on CPU, inside another
capture (megatron-core's whole-iteration graph records the kernels themselves), and after a capture
failed (logged once; training goes on eagerly).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

Outputs = tuple[torch.Tensor, ...]

#: Graphs one function keeps. Training has one token count per run (two streams at most); inputs of
#: varying length (variable sequence lengths) would otherwise capture a graph, and keep its memory
#: pool, for every new length. Shapes beyond the limit run eagerly.
MAX_GRAPHS = 8

#: Eager calls before the capture, on a side stream: lazy initialisations (library handles, sort
#: workspaces, compiled kernels) must not happen inside the capture.
WARMUP_CALLS = 2


@dataclass
class _Captured:
    """One captured graph: its static inputs, its flat output and how to cut that into outputs."""

    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    flat: torch.Tensor
    shapes: tuple[torch.Size, ...]

    def replay(self, inputs: tuple[torch.Tensor, ...]) -> Outputs:
        for static, value in zip(self.inputs, inputs):
            static.copy_(value)
        self.graph.replay()
        flat = self.flat.clone()
        sizes = [math.prod(shape) for shape in self.shapes]
        return tuple(part.view(shape) for part, shape in zip(flat.split(sizes), self.shapes))


class GraphedIndexFunction:
    """``fn(*tensors, **constants)`` replayed from a CUDA graph on GPUs, called eagerly elsewhere.

    ``fn`` must be a pure function of its tensor arguments and keyword constants (no autograd, no
    randomness, no host reads of GPU values) with static output shapes, returning a tuple of tensors
    of one dtype. One graph is captured per (input shapes and dtypes, constants, device, stream), up
    to ``max_graphs``; further keys run eagerly (logged once).
    """

    def __init__(self, fn: Callable[..., Outputs], what: str, max_graphs: int = MAX_GRAPHS) -> None:
        self.fn, self.what, self.max_graphs = fn, what, max_graphs
        self._graphs: dict[Hashable, _Captured] = {}
        self._failed = False
        self._full_logged = False

    @property
    def failed(self) -> bool:
        """Whether a capture failed in this process (the function then runs eagerly)."""
        return self._failed

    def __call__(self, *tensors: torch.Tensor, **constants: Hashable) -> Outputs:
        if not self._replayable(tensors):
            return self.fn(*tensors, **constants)
        stream = torch.cuda.current_stream(tensors[0].device)
        key = (
            tuple((t.shape, t.dtype, t.device) for t in tensors),
            tuple(sorted(constants.items())),
            stream.cuda_stream,
        )
        captured = self._graphs.get(key)
        if captured is None and len(self._graphs) >= self.max_graphs:
            if not self._full_logged:
                self._full_logged = True
                logger.warning(
                    "torch_native %s: %d CUDA graphs already (one per input shape and stream); new shapes run eagerly",
                    self.what,
                    self.max_graphs,
                )
            return self.fn(*tensors, **constants)
        if captured is None:
            try:
                captured = self._graphs[key] = self._capture(tensors, constants, stream)
            except Exception as exc:  # a failed capture must not stop training: stay eager
                self._failed = True
                logger.warning("torch_native %s: CUDA graph capture failed (%s); running it eagerly", self.what, exc)
                return self.fn(*tensors, **constants)
        return captured.replay(tensors)

    def _replayable(self, tensors: tuple[torch.Tensor, ...]) -> bool:
        return (
            not self._failed
            and bool(tensors)
            and all(t.is_cuda for t in tensors)
            and not torch.cuda.is_current_stream_capturing()
        )

    def _capture(
        self, tensors: tuple[torch.Tensor, ...], constants: dict[str, Hashable], stream: torch.cuda.Stream
    ) -> _Captured:
        inputs = tuple(t.detach().clone() for t in tensors)
        side = torch.cuda.Stream(device=stream.device)
        side.wait_stream(stream)
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                outputs = self.fn(*inputs, **constants)
        stream.wait_stream(side)
        dtypes = {o.dtype for o in outputs}
        if len(dtypes) != 1:
            raise TypeError(
                f"{self.what}: outputs must share one dtype to be copied out at once, got {sorted(map(str, dtypes))}"
            )
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            outputs = self.fn(*inputs, **constants)
            flat = torch.cat([o.reshape(-1) for o in outputs])
        stream.wait_stream(side)
        return _Captured(graph, inputs, flat, tuple(o.shape for o in outputs))
