"""Cross-stream checks for the GPU check programs: races and unsafe frees, found whatever the timing.

Two detectors, both fed by torch's CUDA stream sanitizer (``torch.cuda._sanitizer``), which follows
every kernel launched through torch's dispatcher and every event record / wait / synchronisation:

* races: the sanitizer's own check, two accesses to one tensor from two streams, at least one a
  write, with no synchronisation between them. Made to collect instead of raising at the first one.
* unsafe frees: a tensor allocated on stream A, used by a kernel on stream B, and freed while A has
  not waited for that kernel and without ``record_stream(B)``. The caching allocator hands the block
  to the next allocation on A at once, so A's next kernels may overwrite it while B still reads or
  writes it. Eager runs often get away with it (the host is slower than the GPU); a replayed CUDA
  graph keeps only the dependencies, and there it shows. The sanitizer does not report these: it
  forgets a tensor when its memory is freed.

Both see only operators that go through torch's dispatcher: run the torch-native layers without
Triton kernels and ``torch.compile`` while checking. ``self_test`` proves that both fire.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FRAMES = 5  # innermost Python frames kept per access (the key that tells findings apart)


_OWN_FRAMES = ("stream_checks.py", "_python_dispatch.py", "_sanitizer.py", "_pytree.py", "eval_frame.py", "_compile.py")


def _describe(stack, limit: int = FRAMES) -> str:
    """The innermost ``limit`` frames of ``stack`` outside this module and torch's modes, innermost first."""
    kept = [f for f in stack if not f.filename.endswith(_OWN_FRAMES)][-limit:]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in reversed(kept))


def _frames(limit: int = FRAMES) -> str:
    """:func:`_describe` of the caller's stack."""
    return _describe(traceback.extract_stack(), limit)


@dataclass
class Findings:
    """Distinct findings, each printed once when first seen and counted after that."""

    label: list[str] = field(default_factory=lambda: [""])  # what is running (a variant name)
    seen: dict[str, dict] = field(default_factory=dict)

    def add(self, kind: str, key: str, text: str) -> None:
        entry = self.seen.setdefault(f"{kind}: {key}", {"kind": kind, "count": 0, "during": self.label[0]})
        entry["count"] += 1
        if entry["count"] == 1:
            print(f"{kind.upper()} during {self.label[0]}\n{text}", flush=True)

    def count(self, kind: str, during: str | None = None) -> int:
        return sum(
            e["count"] for e in self.seen.values() if e["kind"] == kind and (during is None or e["during"] == during)
        )

    def report(self) -> list[dict]:
        return [dict(where=k, **v) for k, v in self.seen.items()]


def _access(access) -> str:
    return f"{access.operator} {access.type} on stream {access.stream} [{_describe(access.stack_trace)}]"


@dataclass
class _Uses:
    """One allocation's streams: where it was made and the last kernel on every other stream."""

    alloc_stream: int
    made_by: str
    last_seq: dict[int, int] = field(default_factory=dict)
    first_use: dict[int, str] = field(default_factory=dict)
    recorded: set[int] = field(default_factory=set)


class FreeHazardMode(TorchDispatchMode):
    """Notes which streams use each allocation; on its free, reports streams the allocating stream
    has not waited for and that ``record_stream`` did not register. Sits above the sanitizer's own
    mode, whose vector clocks say what each stream has waited for."""

    def __init__(self, handler, findings: Findings) -> None:
        super().__init__()
        self.handler, self.findings = handler, findings
        self.uses: dict[int, _Uses] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        stream = torch.cuda.current_stream().cuda_stream
        if func is torch.ops.aten.record_stream.default:
            entry = self.uses.get(args[0].untyped_storage().data_ptr())
            if entry is not None:
                used = args[1]  # a device-generic torch.Stream here
                entry.recorded.add(
                    torch.cuda.Stream(
                        stream_id=used.stream_id, device_index=used.device_index, device_type=used.device_type
                    ).cuda_stream
                )
            return out
        seq = self.handler.seq_num  # the sanitizer, below this mode, has just numbered this kernel
        for tensor in _cuda_tensors((args, kwargs, out)):
            ptr = tensor.untyped_storage().data_ptr()
            entry = self.uses.get(ptr)
            if entry is None:
                entry = self.uses[ptr] = _Uses(stream, f"{func} [{_frames()}]")
            elif stream != entry.alloc_stream:
                entry.last_seq[stream] = seq
                entry.first_use.setdefault(stream, f"{func} [{_frames()}]")
        return out

    def allocated(self, ptr: int) -> None:
        self.uses.pop(ptr, None)

    def freed(self, ptr: int) -> None:
        entry = self.uses.pop(ptr, None)
        if entry is None:
            return
        for stream, seq in entry.last_seq.items():
            if stream in entry.recorded or self.handler.syncs.is_ordered_after(entry.alloc_stream, seq, stream):
                continue
            used = entry.first_use[stream]
            freed_at = _frames(8)
            self.findings.add(
                "unsafe free",
                f"made by {entry.made_by} || used by {used} || freed at [{freed_at}]",
                f"allocated on stream {entry.alloc_stream} by {entry.made_by}\n"
                f"used on stream {stream} by {used}\nfreed at [{freed_at}] with no wait for that use "
                "and no record_stream",
            )


def _cuda_tensors(tree):
    for leaf in torch.utils._pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and leaf.is_cuda:
            yield leaf


def enable(findings: Findings) -> FreeHazardMode:
    """Turn both detectors on for the rest of the process."""
    import torch.cuda._sanitizer as sanitizer
    from torch.cuda import _gpu_trace

    sanitizer.enable_cuda_sanitizer()
    handler = sanitizer.cuda_sanitizer.dispatch.event_handler
    check = handler._handle_kernel_launch

    def collect(*args, **kwargs):
        for error in check(*args, **kwargs):
            if hasattr(error, "current_access"):
                key = f"now {_access(error.current_access)} || before {_access(error.previous_access)}"
            else:
                key = str(error)[:500]
            findings.add("race", key, str(error))
        return []

    handler._handle_kernel_launch = collect
    mode = FreeHazardMode(handler, findings)
    mode.__enter__()
    _gpu_trace.register_callback_for_memory_allocation(mode.allocated)
    _gpu_trace.register_callback_for_memory_deallocation(mode.freed)
    return mode


def self_test(findings: Findings) -> dict:
    """Provoke one race and one unsafe free, and two safe frees; report what each detector saw."""
    findings.label[0] = "self_test"
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    x = torch.zeros(1 << 20, device="cuda")
    with torch.cuda.stream(side):
        x.add_(1)  # race: written on side, last written on main, no wait
    torch.cuda.synchronize()
    for safe in ("none", "record_stream", "wait"):
        y = torch.ones(1 << 20, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            z = y * 2
        if safe == "record_stream":
            y.record_stream(side)
        elif safe == "wait":
            main.wait_stream(side)
        del y  # only the first of the three is unsafe
        torch.cuda.synchronize()
        del z
    result = {"races": findings.count("race", "self_test"), "unsafe_frees": findings.count("unsafe free", "self_test")}
    result["ok"] = result == {"races": 1, "unsafe_frees": 1}
    return result
