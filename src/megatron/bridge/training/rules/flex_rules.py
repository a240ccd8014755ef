"""Flex token-dispatcher backends (DeepEP, HybridEP): where each runs, and the rules of a choice.

:data:`FLEX_BACKEND_SUPPORT` says which GPUs each backend runs on; :data:`FLEX_RULES` (in the one
registry through the overlap rules) checks a configuration against the target GPU of a
``RuleContext``; :func:`dispatcher_fields` is what choosing a dispatcher sets. The GPU types
themselves are in :mod:`megatron.bridge.training.resolution.gpu_catalog`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from megatron.bridge.training.resolution import gpu_catalog
from megatron.bridge.training.resolution.gpu_catalog import GpuTarget, architecture_name, gpu_target_from_context, target_of
from megatron.bridge.training.rules.core import Rule, RuleContext
from megatron.bridge.utils.flex_backend_names import FLEX_BACKENDS


@dataclass(frozen=True)
class BackendSupport:
    """Where one flex backend runs: capability majors, and whether GB200/GB300 NVL72 systems count."""

    name: str
    label: str
    majors: tuple[int, ...]
    nvl72: bool
    """Runs on GB200/GB300 NVL72 systems (same capability as B200/B300 boards)."""
    applicable: str
    """Where it runs, in the words Megatron-Bridge's own messages use (scripts may match on them)."""

    def describe(self) -> str:
        """``DeepEP: Ampere, Hopper, Blackwell B200/B300 (not GB200/GB300 NVL72)``."""
        archs = ", ".join(architecture_name(m) for m in self.majors)
        systems = "incl. GB200/GB300 NVL72" if self.nvl72 else "B200/B300 (not GB200/GB300 NVL72)"
        return f"{self.label}: {archs} {systems}"

    def support(self, target: GpuTarget) -> tuple[Optional[bool], str]:
        """``True``/``False``, or ``None`` when the target cannot tell (Blackwell of unknown system)."""
        if not target.known:
            return None, "target GPU unknown: support not checked"
        arch = target.architecture
        if target.capability[0] not in self.majors:
            return False, f"{self.applicable}. Current GPU: {_current(target)}"
        if self.nvl72 or target.nvl72 is False:
            return True, f"{self.label} supports {arch}" + (" incl. NVL72" if target.nvl72 else "")
        if target.nvl72 is None:
            return None, f"{self.describe()}; whether the target is an NVL72 system is unknown"
        return False, f"{self.applicable} (not GB200/GB300 NVL72). Current GPU: {_current(target)}"


def _current(target: GpuTarget) -> str:
    """``NVIDIA GB200 (compute capability 10.0)``."""
    major, minor = target.capability
    return f"{target.name or 'GPU'} (compute capability {major}.{minor})"


FLEX_BACKEND_SUPPORT: dict[str, BackendSupport] = {
    "deepep": BackendSupport(
        "deepep", "DeepEP", (8, 9, 10), nvl72=False,
        applicable="DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs",
    ),
    "hybridep": BackendSupport(
        "hybridep", "HybridEP", (8, 9, 10), nvl72=True,
        applicable="HybridEP is only applicable for GB200, GB300 with NVL72 and for Ampere, Hopper, "
        "B200 and B300 GPUs",
    ),
}
"""Flex backend (every name of :data:`FLEX_BACKENDS`) -> the GPUs it supports."""


def backend_support(backend: Optional[str], target: GpuTarget) -> tuple[Optional[bool], str]:
    """Whether ``backend`` runs on ``target``: ``True``, ``False``, or ``None`` when unknown."""
    if backend not in FLEX_BACKEND_SUPPORT:
        return None, f"no GPU-support table for backend {backend!r}"
    return FLEX_BACKEND_SUPPORT[backend].support(target)


def dispatcher_fields(backend: Optional[str]) -> dict[str, Any]:
    """Model fields of a dispatcher choice: a flex backend, or ``None`` for plain ``alltoall``.

    A flex backend also turns shared-expert overlap off, as the upstream selection does.
    """
    if backend is None:
        return {"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None}
    return {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": backend, "moe_shared_expert_overlap": False}


def _flex(cfg: Any) -> bool:
    return cfg.model.moe_token_dispatcher_type == "flex"


def _backend_known(cfg: Any) -> bool:
    return _flex(cfg) and cfg.model.moe_flex_dispatcher_backend in FLEX_BACKEND_SUPPORT


def _support(cfg: Any, ctx: RuleContext) -> tuple[Optional[bool], str]:
    return backend_support(cfg.model.moe_flex_dispatcher_backend, gpu_target_from_context(ctx))


def _gpu_text(ctx: RuleContext) -> str:
    return gpu_target_from_context(ctx).describe()


def _deep_ep_text(ctx: RuleContext) -> str:
    return {True: "importable", False: "not importable", None: "unknown"}[ctx.deep_ep_available]


def _host_text(ctx: RuleContext) -> str:
    return "GPU host" if ctx.cuda_available else "CPU host (dry run)"


_PLAIN_ALLTOALL = "plain alltoall (moe_flex_dispatcher_backend=null; harness: --moe_flex_dispatcher_backend None)"
_SUPPORT_TEXT = "; ".join(b.describe() for b in FLEX_BACKEND_SUPPORT.values())
_NVL72_BACKENDS = " or ".join(b.name for b in FLEX_BACKEND_SUPPORT.values() if b.nvl72)

FLEX_RULES: tuple[Rule, ...] = (
    Rule(
        id="flex-backend-known",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        holds=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend in FLEX_BACKEND_SUPPORT,
        message="unknown flex dispatcher backend (only backends with a GPU-support table are accepted)",
        fix=f"use one of {', '.join(FLEX_BACKENDS)}, or {_PLAIN_ALLTOALL}",
    ),
    Rule(
        id="flex-backend-needs-flex-dispatcher",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend", "model.moe_token_dispatcher_type"),
        applies=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        holds=lambda cfg, ctx: _flex(cfg),
        message="a flex backend does nothing while the dispatcher is not flex: megatron-core reads the "
        "backend only inside the flex dispatcher",
        fix="set model.moe_token_dispatcher_type=flex (or use --moe_flex_dispatcher_backend, which "
        "sets both), or model.moe_flex_dispatcher_backend=null for plain alltoall",
    ),
    Rule(
        id="flex-dispatcher-needs-backend",
        group="flex-dispatcher",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _flex(cfg),
        holds=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        message="the flex dispatcher needs an explicit backend (no hidden megatron-core default)",
        fix=f"set model.moe_flex_dispatcher_backend to one of {', '.join(FLEX_BACKENDS)}",
    ),
    Rule(
        id="flex-backend-supported-on-gpu",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: _backend_known(cfg),
        holds=lambda cfg, ctx: _support(cfg, ctx)[0] is not False,
        message=f"this flex backend does not support the target GPU ({_SUPPORT_TEXT})",
        fix=f"choose a backend that supports the target GPU ({_NVL72_BACKENDS} on GB200/GB300), or {_PLAIN_ALLTOALL}",
        extra_values=(("target_gpu", _gpu_text),),
        derived_values=(("support", lambda cfg, ctx: _support(cfg, ctx)[1]),),
    ),
    Rule(
        id="flex-backend-gpu-not-checked",
        group="flex-dispatcher",
        severity="warning",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: _backend_known(cfg),
        holds=lambda cfg, ctx: _support(cfg, ctx)[0] is not None,
        message="backend support on the target GPU could not be decided (no GPU type given and no "
        "visible GPU, or a Blackwell capability without the system name)",
        fix="pass the GPU type (-g h100/b200/gb200...) to validate against the cluster's GPUs",
        extra_values=(("target_gpu", _gpu_text),),
        derived_values=(("support", lambda cfg, ctx: _support(cfg, ctx)[1]),),
    ),
    Rule(
        id="flex-needs-deep-ep",
        group="flex-dispatcher",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _backend_known(cfg) and bool(ctx.cuda_available),
        holds=lambda cfg, ctx: ctx.deep_ep_available is not False,
        message="the flex dispatcher backends need the deep_ep package, which does not import here",
        fix="install DeepEP on the GPU machines (see https://github.com/deepseek-ai/DeepEP, hybrid-ep "
        f"branch for hybridep), or use {_PLAIN_ALLTOALL}",
        extra_values=(("deep_ep", _deep_ep_text), ("host", _host_text)),
    ),
    Rule(
        id="flex-deep-ep-not-checked-on-cpu-host",
        group="flex-dispatcher",
        severity="warning",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _backend_known(cfg) and not ctx.cuda_available,
        holds=lambda cfg, ctx: ctx.deep_ep_available is not False,
        message="note: deep_ep does not import on this CPU host; the GPU machines must have it",
        fix="make sure DeepEP is installed where the job runs",
        extra_values=(("deep_ep", _deep_ep_text), ("host", _host_text)),
    ),
)
"""Flex-dispatcher prerequisites, evaluated against the target GPU of a ``RuleContext``."""


def render_support_table() -> str:
    """Markdown table of GPU types x backends, for the docs page."""
    names = list(FLEX_BACKEND_SUPPORT)
    header = (
        "| `-g` | capability | architecture | NVL72 | " + " | ".join(names) + " |\n"
        + "|---|---|---|---|" + "---|" * len(names) + "\n"
    )
    rows = []
    for entry in gpu_catalog.GPU_TYPES.values():
        cells = ["yes" if backend_support(b, target_of(entry))[0] else "no" for b in names]
        major, minor = entry.capability
        rows.append(
            f"| `{entry.name}` | {major}.{minor} | {entry.architecture} | "
            f"{'yes' if entry.nvl72 else 'no'} | " + " | ".join(cells) + " |"
        )
    return header + "\n".join(rows) + "\n"
