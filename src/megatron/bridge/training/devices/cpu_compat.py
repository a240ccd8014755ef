"""CPU smoke mode: make stock megatron-core (0.19.x) run forward/backward/optimizer steps on CPU.

megatron-core assumes CUDA throughout: it creates CUDA streams and events at construction time,
allocates buffers with ``device="cuda"`` / ``torch.cuda.current_device()``, asserts that gradients
report ``torch.cuda.FloatTensor`` and hands all-to-all split sizes to ``torch.distributed`` as
numpy arrays only after a device-to-host copy. None of that has a CPU fallback.

This module maps exactly those points to CPU, process-wide, and nothing else:

* ``torch.cuda.Stream/Event/stream/current_stream/default_stream/set_stream/synchronize`` become
  no-op CPU objects (CPU work is synchronous, so ordering is trivially respected);
* ``torch.cuda.current_device()`` returns ``torch.device("cpu")``;
* ``device="cuda"`` (or a CUDA device index) in the tensor factories, ``Tensor.to``,
  ``Tensor.cuda`` and ``Module.cuda`` is rewritten to CPU;
* ``Tensor.type()`` (no arguments) reports ``torch.cuda.*Tensor`` for CPU tensors;
* ``Tensor.record_stream`` and ``torch.cuda.nvtx.range_push/pop`` are no-ops;
* megatron's ``maybe_move_tensor_to_cpu`` returns numpy split sizes for CPU tensors too;
* where Transformer Engine imports, megatron-core picks TE's CUDA-only kernels at import (the router
  GEMM, fused Adam/SGD, the multi-tensor gradient norm and scale); they are swapped for the
  torch implementations megatron-core itself uses without TE.

It is **only** activated by the CPU smoke mode (``cfg.dist.device == "cpu"``) and is never
imported implicitly on GPU: a GPU process must not see CUDA calls silently turned into CPU ones.
Activation is loud and irreversible for the life of the process.

Seeding on CPU: megatron's CUDA RNG tracker cannot fork CPU generator states, so
:func:`seed_cpu_model_parallel` uses megatron's inference tracker (forks are no-ops) plus
``torch.manual_seed``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)

_ENABLED = False

BANNER = "CPU smoke mode: megatron-core CUDA calls mapped to CPU (correctness only, not for performance)"

_FACTORIES = (
    "empty",
    "zeros",
    "ones",
    "full",
    "tensor",
    "as_tensor",
    "arange",
    "rand",
    "randn",
    "randint",
    "randperm",
    "empty_strided",
    "linspace",
    "eye",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "rand_like",
    "randn_like",
)


def cpu_compat_enabled() -> bool:
    """True once :func:`enable_cpu_compat` has run in this process."""
    return _ENABLED


def _is_cuda_device(device: Any) -> bool:
    """Whether ``device`` names a CUDA device (``"cuda"``, ``"cuda:0"``, ``torch.device``, an index)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # A bare integer index means a CUDA device in torch's factory and ``.to`` APIs.
    return isinstance(device, int) and not isinstance(device, bool)


def _cpu_if_cuda(device: Any) -> Any:
    return torch.device("cpu") if _is_cuda_device(device) else device


class CpuEvent:
    """Stand-in for ``torch.cuda.Event``: CPU work is synchronous, so every event is complete."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing

    def record(self, stream: CpuStream | None = None) -> None:
        """Nothing to record: all prior CPU work has already finished."""

    def wait(self, stream: CpuStream | None = None) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Already complete."""

    def elapsed_time(self, end_event: CpuEvent) -> float:
        return 0.0


class CpuStream:
    """Stand-in for ``torch.cuda.Stream``; supports the calls megatron-core makes on streams."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        self.device = torch.device("cpu")
        self.priority = priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        return (0, -1)

    def wait_stream(self, stream: CpuStream) -> None:
        """Streams are serial on CPU."""

    def wait_event(self, event: CpuEvent) -> None:
        """Events are always complete on CPU."""

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        return event if event is not None else CpuEvent()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing is ever pending."""

    def __enter__(self) -> CpuStream:
        _STREAM_STACK.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _STREAM_STACK.pop()


_DEFAULT_STREAM = CpuStream()
_STREAM_STACK: list[CpuStream] = []


def _current_stream(device: Any = None) -> CpuStream:
    return _STREAM_STACK[-1] if _STREAM_STACK else _DEFAULT_STREAM


def _default_stream(device: Any = None) -> CpuStream:
    return _DEFAULT_STREAM


@contextlib.contextmanager
def _stream_ctx(stream: CpuStream | None) -> Iterator[CpuStream | None]:
    """``torch.cuda.stream(s)``: makes ``s`` the current stream, as on GPU."""
    if stream is None:
        yield None
        return
    _STREAM_STACK.append(stream)
    try:
        yield stream
    finally:
        _STREAM_STACK.pop()


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _patch_streams_and_devices() -> None:
    cuda = torch.cuda
    cuda.Stream = CpuStream  # type: ignore[misc,assignment]
    cuda.Event = CpuEvent  # type: ignore[misc,assignment]
    cuda.stream = _stream_ctx  # type: ignore[assignment]
    cuda.current_stream = _current_stream  # type: ignore[assignment]
    cuda.default_stream = _default_stream  # type: ignore[assignment]
    cuda.set_stream = _noop  # type: ignore[assignment]
    cuda.synchronize = _noop  # type: ignore[assignment]
    cuda.empty_cache = _noop  # type: ignore[assignment]
    cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    cuda.is_current_stream_capturing = lambda: False  # type: ignore[assignment]
    cuda.nvtx.range_push = _noop  # type: ignore[assignment]
    cuda.nvtx.range_pop = _noop  # type: ignore[assignment]
    cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]


def _wrap_factory(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def factory(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _cpu_if_cuda(kwargs["device"])
        kwargs.pop("pin_memory", None)  # pinning needs a CUDA driver
        return fn(*args, **kwargs)

    return factory


def _patch_factories() -> None:
    for name in _FACTORIES:
        original = getattr(torch, name, None)
        if original is not None:
            setattr(torch, name, _wrap_factory(original))


def _patch_tensor_methods() -> None:
    tensor_to = torch.Tensor.to
    tensor_type = torch.Tensor.type
    module_to = torch.nn.Module.to

    @functools.wraps(tensor_to)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args and not isinstance(args[0], (torch.dtype, torch.Tensor)):
            args = (_cpu_if_cuda(args[0]),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = _cpu_if_cuda(kwargs["device"])
        return tensor_to(self, *args, **kwargs)

    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
        return self

    @functools.wraps(tensor_type)
    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None and not kwargs:
            name = tensor_type(self)
            if self.device.type == "cpu" and name.startswith("torch.") and ".cuda." not in name:
                return "torch.cuda." + name[len("torch.") :]
            return name
        return tensor_type(self, dtype, non_blocking, **kwargs)

    def module_cuda(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
        return self

    @functools.wraps(module_to)
    def module_to_cpu(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        if args and not isinstance(args[0], (torch.dtype, torch.Tensor)):
            args = (_cpu_if_cuda(args[0]),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = _cpu_if_cuda(kwargs["device"])
        return module_to(self, *args, **kwargs)

    torch.Tensor.to = to  # type: ignore[method-assign]
    torch.Tensor.cuda = cuda  # type: ignore[method-assign]
    torch.Tensor.type = type_  # type: ignore[method-assign,assignment]
    torch.Tensor.record_stream = _noop  # type: ignore[method-assign,assignment]
    torch.nn.Module.cuda = module_cuda  # type: ignore[method-assign]
    torch.nn.Module.to = module_to_cpu  # type: ignore[method-assign]


def _cpu_maybe_move_tensor_to_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """megatron's ``maybe_move_tensor_to_cpu`` for CPU tensors: gloo's all-to-all wants plain sizes."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.detach().cpu().numpy()
    return tensor


def _patch_megatron() -> None:
    # Deferred: the megatron-core modules this layer patches are imported when it is enabled.
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    moe_utils.maybe_move_tensor_to_cpu = _cpu_maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = _cpu_maybe_move_tensor_to_cpu


def _patch_transformer_engine_kernels() -> None:
    """megatron-core's choices of TE kernels at import, undone: TE's kernels only run on CUDA."""
    # Deferred, as in _patch_megatron().
    from megatron.core import optimizer as mcore_optimizer
    from megatron.core import utils as mcore_utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as optimizer_impl
    from megatron.core.transformer.moe import moe_utils

    moe_utils.te_general_gemm = None  # the router's gating GEMM falls back to torch.mm
    mcore_optimizer.Adam, mcore_optimizer.SGD = torch.optim.AdamW, torch.optim.SGD
    mcore_optimizer.USING_PYTORCH_OPTIMIZER = True  # megatron then passes torch's keyword arguments
    for module in (clip_grads, optimizer_impl):
        module.multi_tensor_applier = mcore_utils.local_multi_tensor_applier
        module.multi_tensor_scale_impl = mcore_utils.local_multi_tensor_scale
    clip_grads.l2_norm_impl = mcore_utils.local_multi_tensor_l2_norm
    clip_grads.multi_tensor_scale_tensor_impl = None


def enable_cpu_compat() -> None:
    """Map megatron-core's CUDA calls to CPU for the rest of this process (idempotent, logged)."""
    global _ENABLED
    if _ENABLED:
        return
    if torch.cuda.is_available():
        logger.warning("CPU smoke mode requested on a machine with CUDA: the GPU will not be used.")
    _patch_streams_and_devices()
    _patch_factories()
    _patch_tensor_methods()
    _patch_megatron()
    _patch_transformer_engine_kernels()
    _ENABLED = True
    logger.warning(BANNER)
    if os.environ.get("RANK", "0") == "0":  # once per job, not once per rank
        print(f"[megatron.bridge] {BANNER}", flush=True)


def seed_cpu_model_parallel(seed: int) -> None:
    """Seed megatron's RNG tracker and torch's CPU generator (model parallel state must exist).

    The inference tracker makes megatron's RNG forks no-ops: CPU has a single generator and
    megatron's tracker only knows how to swap CUDA generator states.
    """
    # Deferred, as in _patch_megatron(): this module loads no megatron-core until it is used.
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
