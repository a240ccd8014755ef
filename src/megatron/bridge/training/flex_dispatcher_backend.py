"""Flex token-dispatcher backends (DeepEP, HybridEP): one support table, the rules, and selection.

:data:`FLEX_BACKEND_SUPPORT` says which GPUs each backend runs on. Everything else reads it: the
rules in :data:`FLEX_RULES` (which ``cfg.validate()`` checks against the target GPU, the harness's
``-g``), the selection :func:`apply_flex_dispatcher_backend` (which refuses through the same rules),
the model field's allowed values, the harness's ``--moe_flex_dispatcher_backend`` choices and the
docs table. The GPU types themselves are in :mod:`megatron.bridge.training.resolution.gpu_catalog`.

Setting ``moe_flex_dispatcher_backend`` alone does not activate flex dispatch: the dispatcher type
must be ``flex`` as well. A dispatcher choice therefore sets the fields :func:`dispatcher_fields`
lists, and a backend without the flex dispatcher is an error (``flex-backend-needs-flex-dispatcher``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch

from megatron.bridge.training.resolution import gpu_catalog
from megatron.bridge.training.errors import CommOverlapConfigError, Violation
from megatron.bridge.training.resolution.gpu_catalog import GpuTarget, architecture_name, gpu_target_from_context, target_of
from megatron.bridge.training.rules.core import Rule, RuleContext
from megatron.bridge.utils.flex_backend_names import FLEX_BACKENDS, FlexBackend  # noqa: F401  (read from here)
from megatron.bridge.utils.import_utils import have_deep_ep

logger = logging.getLogger(__name__)

Fallback = Optional[Literal["alltoall"]]


class FlexDispatcherBackendError(CommOverlapConfigError):
    """The requested flex backend cannot run on the target GPU or machine (all problems listed)."""


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


# --------------------------------------------------------------------------------------------
# Rules (read by cfg.validate() through the overlap rules table, and by the selection below)


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


# --------------------------------------------------------------------------------------------
# Python API on a bare model config


@dataclass
class _ModelOnly:
    """Lets the config-level rules read a bare model config (``cfg.model.<field>``)."""

    model: Any


@dataclass
class _ModelWith:
    """A model config seen with some fields replaced (the choice being checked), unchanged itself."""

    base: Any
    fields: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        return self.fields[name] if name in self.fields else getattr(self.base, name)


def flex_dispatcher_violations(
    model_config: Any,
    target: GpuTarget,
    *,
    deep_ep_available: Optional[bool] = None,
    gpu_host: Optional[bool] = None,
) -> list[Violation]:
    """Every flex-dispatcher problem of ``model_config`` for ``target`` (errors and notes).

    ``gpu_host``: whether this process runs on a GPU machine (default: a GPU is visible). A missing
    ``deep_ep`` is an error there and a note on a CPU host (dry run).
    """
    if gpu_host is None:
        gpu_host = gpu_catalog.visible_gpu()[0] is not None
    if deep_ep_available is None:
        deep_ep_available = have_deep_ep()
    ctx = RuleContext(
        device_capability=target.capability,
        device_name=target.name,
        cuda_available=gpu_host,
        deep_ep_available=deep_ep_available,
    )
    shim = _ModelOnly(model_config)
    return [v for v in (rule.check(shim, ctx) for rule in FLEX_RULES) if v is not None]


def validate_flex_dispatcher_backend(
    model_config: Any,
    *,
    device_capability: Optional[tuple[int, int]] = None,
    device_name: Optional[str] = None,
) -> list[Violation]:
    """Raise ``FlexDispatcherBackendError`` listing every problem; return the notes (warnings).

    Call it before the model is built: megatron-core only notices a missing ``deep_ep`` when it
    builds the MoE layer.
    """
    target = gpu_catalog.resolve_gpu_target(device_capability, device_name)
    found = flex_dispatcher_violations(model_config, target)
    errors = [v for v in found if v.severity == "error"]
    if errors:
        raise FlexDispatcherBackendError(errors, title="flex dispatcher cannot run as configured")
    for note in found:
        logger.warning("flex dispatcher: %s", note.format())
    return found


def _rank_zero() -> bool:
    """Whether this process logs the once-per-job notes (rank 0, or no process group yet)."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or (
        torch.distributed.get_rank() == 0
    )


def _is_dense(model_config: Any) -> bool:
    """A model without MoE layers (``num_moe_experts`` unset or 0): it has no token dispatcher."""
    return not getattr(model_config, "num_moe_experts", None)


def probe_target_gpu(backend: Optional[str]) -> GpuTarget:
    """The GPU this process runs on, for a selection given no target GPU.

    The catalogue's probe answers first (it leaves CUDA uninitialised). When it cannot tell but
    CUDA reports a GPU, torch is asked, and a failure there raises ``FlexDispatcherBackendError``
    (the original error chained): the backend is never applied unchecked on a GPU machine.
    """
    target = gpu_catalog.resolve_gpu_target()
    if target.known or not torch.cuda.is_available():
        return target
    try:
        props = torch.cuda.get_device_properties(0)
        found = gpu_catalog.resolve_gpu_target((props.major, props.minor), props.name)
    except Exception as exc:
        problem = _probe_failure(backend, exc)
        raise FlexDispatcherBackendError([problem], title="flex dispatcher cannot check the GPU") from exc
    return dataclasses.replace(found, source="visible GPU")


def _probe_failure(backend: Optional[str], exc: Exception) -> Violation:
    return Violation(
        rule="flex-backend-gpu-probe-failed",
        fields=("model.moe_flex_dispatcher_backend", "torch.cuda.get_device_properties(0)"),
        values=(backend, f"raised {type(exc).__name__}: {exc}"),
        message="CUDA reports a GPU but its type could not be read, so whether the backend supports "
        "it cannot be checked",
        fix="pass the target GPU (device_name='h100', 'gb200', ... or device_capability=(9, 0)), or "
        "repair the CUDA setup (driver, CUDA_VISIBLE_DEVICES)",
    )


def apply_flex_dispatcher_backend(
    model_config: Any,
    moe_flex_dispatcher_backend: Optional[str] = None,
    *,
    device_capability: Optional[tuple[int, int]] = None,
    device_name: Optional[str] = None,
    fallback: Fallback = None,
) -> Optional[str]:
    """Select a dispatcher on ``model_config``; return the backend in effect (``None`` = alltoall).

    Sets the fields of :func:`dispatcher_fields`. The choice is checked with :data:`FLEX_RULES` for
    the target GPU (the arguments, else :func:`probe_target_gpu`; ``deep_ep`` is checked by
    ``validate``, where the job runs): a backend the GPU does not support raises
    ``FlexDispatcherBackendError`` naming the rule, unless ``fallback="alltoall"``, which then
    selects plain alltoall and logs why. A dense model (no MoE experts) has no dispatcher: it is
    left unchanged, with a warning, and ``None`` is returned.
    """
    if fallback not in (None, "alltoall"):
        raise ValueError(f"fallback must be None or 'alltoall', got {fallback!r}")
    if _is_dense(model_config):
        if _rank_zero():
            logger.warning(
                "flex dispatcher: DeepEP and HybridEP are only applicable to MoE models; "
                "model.num_moe_experts=%r, so the dispatcher selection (%r) is skipped and the model "
                "config is left unchanged",
                getattr(model_config, "num_moe_experts", None),
                moe_flex_dispatcher_backend,
            )
        return None
    choice = dispatcher_fields(moe_flex_dispatcher_backend)
    if device_capability is not None or device_name is not None:
        target = gpu_catalog.resolve_gpu_target(device_capability, device_name)
    elif moe_flex_dispatcher_backend is None:
        target = GpuTarget()  # plain alltoall runs on any GPU
    else:
        target = probe_target_gpu(moe_flex_dispatcher_backend)
    found = flex_dispatcher_violations(_ModelWith(model_config, choice), target, deep_ep_available=True)
    errors = [v for v in found if v.severity == "error"]
    if errors and fallback == "alltoall" and all(v.rule == "flex-backend-supported-on-gpu" for v in errors):
        logger.warning("flex dispatcher: %s\nfalling back to plain alltoall as requested", errors[0].format())
        choice, found, errors = dispatcher_fields(None), [], []
    if errors:
        raise FlexDispatcherBackendError(errors, title="flex dispatcher cannot run as requested")
    for note in found:
        logger.warning("flex dispatcher: %s", note.format())
    for name, value in choice.items():
        setattr(model_config, name, value)
    return choice["moe_flex_dispatcher_backend"]


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
