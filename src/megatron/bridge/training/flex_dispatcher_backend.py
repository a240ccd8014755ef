"""Flex token-dispatcher backends (DeepEP, HybridEP): selection and validation against a target GPU.

The target GPU comes from the caller (the harness's ``-g`` GPU type, e.g. ``h100`` or ``gb200``),
else from the visible GPU, else it is unknown and only GPU-independent checks run (a dry run on a
CPU login node must not fail because the login node has no GPU).

Architecture is read from the compute capability, never from a name prefix. The only thing a
capability cannot tell is a B200/B300 board from a GB200/GB300 NVL72 system (same SM), which is
why the system name is kept beside it.

The same facts feed ``cfg.validate()``: ``finalize`` puts the target GPU into ``RuleContext``
and the rules in ``comm_overlap.FLEX_RULES`` call :func:`backend_support`.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional

from megatron.bridge.training.errors import CommOverlapConfigError, Violation
from megatron.bridge.utils.import_utils import have_deep_ep

if TYPE_CHECKING:
    from megatron.bridge.training.rules import RuleContext

logger = logging.getLogger(__name__)

FlexBackend = Literal["deepep", "hybridep"]
Fallback = Optional[Literal["alltoall"]]


class FlexDispatcherBackendError(CommOverlapConfigError):
    """The requested flex backend cannot run on the target GPU or machine (all problems listed)."""


@dataclass(frozen=True)
class GpuType:
    """A GPU type the harness's ``-g`` accepts."""

    name: str
    capability: tuple[int, int]
    architecture: str
    nvl72: bool = False
    """Part of a GB200/GB300 NVL72 rack-scale system (multi-node NVLink domain)."""


GPU_TYPES: dict[str, GpuType] = {
    "a100": GpuType("a100", (8, 0), "Ampere"),
    "h100": GpuType("h100", (9, 0), "Hopper"),
    "h200": GpuType("h200", (9, 0), "Hopper"),
    "b200": GpuType("b200", (10, 0), "Blackwell"),
    # B300/GB300 (Blackwell Ultra) report compute capability 10.3 (sm_103).
    "b300": GpuType("b300", (10, 3), "Blackwell"),
    "gb200": GpuType("gb200", (10, 0), "Blackwell", nvl72=True),
    "gb300": GpuType("gb300", (10, 3), "Blackwell", nvl72=True),
}
"""``-g`` GPU types. B300/GB300 are listed as (10, 3): that is what the chips report."""


@dataclass(frozen=True)
class GpuTarget:
    """The GPU a run is validated for, and where that knowledge came from."""

    capability: Optional[tuple[int, int]] = None
    name: Optional[str] = None
    nvl72: Optional[bool] = None
    """``None``: unknown (a Blackwell capability without a system name)."""
    source: str = "unknown"
    """``argument``, ``visible GPU`` or ``unknown``."""

    @property
    def known(self) -> bool:
        """Whether anything is known about the target."""
        return self.capability is not None

    @property
    def architecture(self) -> Optional[str]:
        """Ampere/Hopper/Blackwell/... from the capability major."""
        if self.capability is None:
            return None
        return {8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell (consumer)"}.get(
            self.capability[0], f"sm_{self.capability[0]}{self.capability[1]}"
        )

    def describe(self) -> str:
        """For messages: ``gb200 (10.0, Blackwell, NVL72; argument)``."""
        if not self.known:
            return "unknown (no GPU type given and no visible GPU)"
        major, minor = self.capability
        system = {True: ", NVL72", False: "", None: ", NVL72 unknown"}[self.nvl72]
        label = self.name or "GPU"
        return f"{label} ({major}.{minor}, {self.architecture}{system}; {self.source})"


_NVL72_NAME = re.compile(r"\bgb[23]00\b")


def gpu_type(name: str) -> Optional[GpuType]:
    """The table entry for a ``-g`` value or a device name (``"NVIDIA GB200"`` -> ``gb200``)."""
    key = name.strip().lower()
    if key in GPU_TYPES:
        return GPU_TYPES[key]
    for token in re.findall(r"[a-z]+\d+", key):
        if token in GPU_TYPES:
            return GPU_TYPES[token]
    return None


def _nvl72_from_name(name: Optional[str], capability: tuple[int, int]) -> Optional[bool]:
    if capability[0] != 10:
        return False
    if not name:
        return None
    entry = gpu_type(name)
    if entry is not None:
        return entry.nvl72
    return bool(_NVL72_NAME.search(name.lower())) or None


def visible_gpu() -> tuple[Optional[tuple[int, int]], Optional[str]]:
    """Capability and name of GPU 0, or ``(None, None)`` on a machine without a usable GPU.

    Validation runs before training sets ``CUDA_DEVICE_MAX_CONNECTIONS``, which CUDA reads when it
    initialises; so unless CUDA is already initialised, ask ``nvidia-smi`` rather than torch.
    """
    return _probe_visible_gpu()


@functools.cache
def _probe_visible_gpu() -> tuple[Optional[tuple[int, int]], Optional[str]]:
    try:
        import torch

        if not torch.cuda.is_available():
            return None, None
        if not torch.cuda.is_initialized():
            found = _query_nvidia_smi()
            if found[0] is not None:
                return found
        return tuple(torch.cuda.get_device_capability(0)), torch.cuda.get_device_name(0)
    except Exception:  # a broken driver is "no GPU" for validation purposes
        return None, None


def _query_nvidia_smi() -> tuple[Optional[tuple[int, int]], Optional[str]]:
    """``(capability, name)`` of GPU 0 from ``nvidia-smi`` (does not initialise CUDA here)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
        return parse_nvidia_smi(out)
    except (OSError, subprocess.SubprocessError):
        return None, None


def parse_nvidia_smi(text: str) -> tuple[Optional[tuple[int, int]], Optional[str]]:
    """Parse ``NVIDIA H100 80GB HBM3, 9.0`` (first line) into ``((9, 0), "NVIDIA H100 80GB HBM3")``."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or "," not in lines[0]:
        return None, None
    name, _, cap = lines[0].rpartition(",")
    major, _, minor = cap.strip().partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return None, None
    return (int(major), int(minor)), name.strip()


def resolve_gpu_target(
    device_capability: Optional[tuple[int, int]] = None,
    device_name: Optional[str] = None,
    *,
    detect: bool = True,
) -> GpuTarget:
    """The target GPU: from the arguments, else the visible GPU (when ``detect``), else unknown.

    ``device_name`` may be a ``-g`` type (``h100``) or a device name (``NVIDIA H100 80GB HBM3``);
    an explicit ``device_capability`` wins over the table's.
    """
    source = "argument"
    if device_capability is None and device_name is None and detect:
        device_capability, device_name = visible_gpu()
        source = "visible GPU"
    entry = gpu_type(device_name) if device_name else None
    capability = tuple(device_capability) if device_capability is not None else (
        entry.capability if entry else None
    )
    if capability is None:
        return GpuTarget(name=device_name, source="unknown")
    label = entry.name if entry else device_name
    return GpuTarget(capability, label, _nvl72_from_name(device_name, capability), source)


def gpu_target_from_context(ctx: "RuleContext") -> GpuTarget:
    """The target described by a ``RuleContext`` (``finalize`` already chose argument vs visible)."""
    return resolve_gpu_target(ctx.device_capability, ctx.device_name, detect=False)


def _deepep_support(target: GpuTarget) -> tuple[Optional[bool], str]:
    major = target.capability[0]
    if major in (8, 9):
        return True, f"DeepEP supports {target.architecture}"
    if major == 10:
        if target.nvl72 is None:
            return None, "DeepEP supports B200/B300 but not GB200/GB300 NVL72; which one is unknown"
        if target.nvl72:
            return False, "DeepEP does not support GB200/GB300 NVL72 systems (use hybridep)"
        return True, "DeepEP supports B200/B300"
    return False, f"DeepEP supports Ampere, Hopper and B200/B300, not {target.architecture}"


def _hybridep_support(target: GpuTarget) -> tuple[Optional[bool], str]:
    major = target.capability[0]
    if major in (8, 9, 10):
        return True, f"HybridEP supports {target.architecture}"
    return False, f"HybridEP supports Ampere, Hopper and Blackwell, not {target.architecture}"


BACKEND_SUPPORT = {"deepep": _deepep_support, "hybridep": _hybridep_support}
"""Backend -> ``support(target) -> (True | False | None, reason)``; ``None`` means cannot tell."""


def backend_support(backend: Optional[str], target: GpuTarget) -> tuple[Optional[bool], str]:
    """Whether ``backend`` runs on ``target``: ``True``, ``False``, or ``None`` when unknown."""
    if backend not in BACKEND_SUPPORT:
        return None, f"no GPU-support table for backend {backend!r}"
    if not target.known:
        return None, "target GPU unknown: support not checked"
    return BACKEND_SUPPORT[backend](target)


def _violation(rule: str, fields: tuple[str, ...], values: tuple[Any, ...], message: str, fix: str,
               severity: str = "error") -> Violation:
    return Violation(rule, fields, values, message, fix, severity)


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
    from megatron.bridge.training.comm_overlap import FLEX_RULES
    from megatron.bridge.training.rules import RuleContext

    if gpu_host is None:
        gpu_host = visible_gpu()[0] is not None
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


@dataclass
class _ModelOnly:
    """Lets the config-level rules read a bare model config (``cfg.model.<field>``)."""

    model: Any


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
    target = resolve_gpu_target(device_capability, device_name)
    found = flex_dispatcher_violations(model_config, target)
    errors = [v for v in found if v.severity == "error"]
    if errors:
        raise FlexDispatcherBackendError(errors, title="flex dispatcher cannot run as configured")
    for note in found:
        logger.warning("flex dispatcher: %s", note.format())
    return found


def apply_flex_dispatcher_backend(
    model_config: Any,
    moe_flex_dispatcher_backend: Optional[str] = None,
    *,
    device_capability: Optional[tuple[int, int]] = None,
    device_name: Optional[str] = None,
    fallback: Fallback = None,
) -> Optional[str]:
    """Select a dispatcher backend on ``model_config``; return the backend in effect (``None`` = alltoall).

    A backend sets dispatcher ``flex``, the backend and ``moe_shared_expert_overlap=False``;
    ``None`` sets plain ``alltoall``. A backend the target GPU does not support raises
    ``FlexDispatcherBackendError`` unless ``fallback="alltoall"``, which is then logged.
    """
    if fallback not in (None, "alltoall"):
        raise ValueError(f"fallback must be None or 'alltoall', got {fallback!r}")
    if moe_flex_dispatcher_backend is None:
        _set_alltoall(model_config)
        return None
    if moe_flex_dispatcher_backend not in BACKEND_SUPPORT:
        raise FlexDispatcherBackendError(
            [
                _violation(
                    "flex-backend-known",
                    ("model.moe_flex_dispatcher_backend",),
                    (moe_flex_dispatcher_backend,),
                    "unknown flex dispatcher backend",
                    f"use one of {sorted(BACKEND_SUPPORT)} or None (plain alltoall)",
                )
            ]
        )
    target = resolve_gpu_target(device_capability, device_name)
    supported, reason = backend_support(moe_flex_dispatcher_backend, target)
    if supported is False:
        if fallback == "alltoall":
            logger.warning(
                "flex backend %s refused on %s (%s); falling back to plain alltoall as requested",
                moe_flex_dispatcher_backend, target.describe(), reason,
            )
            _set_alltoall(model_config)
            return None
        raise FlexDispatcherBackendError(
            [
                _violation(
                    "flex-backend-supported-on-gpu",
                    ("model.moe_flex_dispatcher_backend", "target_gpu"),
                    (moe_flex_dispatcher_backend, target.describe()),
                    reason,
                    "use hybridep on GB200/GB300, plain alltoall (None), or pass fallback='alltoall'",
                )
            ]
        )
    if supported is None:
        logger.warning("flex backend %s: %s; validate again with the GPU type", moe_flex_dispatcher_backend, reason)
    if getattr(model_config, "moe_shared_expert_overlap", False):
        logger.warning("flex backend %s: turning moe_shared_expert_overlap off", moe_flex_dispatcher_backend)
    model_config.moe_token_dispatcher_type = "flex"
    model_config.moe_flex_dispatcher_backend = moe_flex_dispatcher_backend
    model_config.moe_shared_expert_overlap = False
    return moe_flex_dispatcher_backend


def _set_alltoall(model_config: Any) -> None:
    model_config.moe_token_dispatcher_type = "alltoall"
    model_config.moe_flex_dispatcher_backend = None


def render_support_table() -> str:
    """Markdown table of GPU types x backends, for the docs page."""
    header = "| `-g` | capability | architecture | NVL72 | deepep | hybridep |\n|---|---|---|---|---|---|\n"
    rows = []
    for entry in GPU_TYPES.values():
        target = GpuTarget(entry.capability, entry.name, entry.nvl72, "argument")
        cells = ["yes" if backend_support(b, target)[0] else "no" for b in BACKEND_SUPPORT]
        major, minor = entry.capability
        rows.append(
            f"| `{entry.name}` | {major}.{minor} | {entry.architecture} | "
            f"{'yes' if entry.nvl72 else 'no'} | {cells[0]} | {cells[1]} |"
        )
    return header + "\n".join(rows) + "\n"
