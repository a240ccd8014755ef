"""The GPUs each flex token-dispatcher backend (DeepEP, HybridEP, NCCL EP) runs on, judged for a target.

Each flex dispatch path (``models/dispatch/``) names its GPUs in a ``BackendSupport`` record; the table
of them (:func:`flex_backend_support`) is read by the flex rules (``flex_rules.py``: ``flex-backend-known``,
``flex-backend-supported-on-gpu``), by ``apply_``/``validate_flex_dispatcher_backend`` and by the
support table on the overlap page (:func:`render_support_table`). A target is judged by its compute
capability, plus its system where the capability cannot tell: a GB200/GB300 NVL72 system has the
SM of a B200/B300 board, and DeepEP runs on the B200 and B300 boards only (the Blackwell GPUs
Megatron-Bridge's own check names).
"""

from __future__ import annotations

from megatron.bridge.models.dispatch.dispatch_path import BackendSupport
from megatron.bridge.models.dispatch.path_registry import paths_of
from megatron.bridge.training.config_stages.facts.gpu_catalog import (
    GPU_TYPES,
    GpuTarget,
    architecture_name,
    gpu_type,
    target_of,
)

BLACKWELL_MAJOR = 10
"""Compute-capability major of the Blackwell data-center GPUs (B100/B200/B300, GB200/GB300)."""


def describe_support(entry: BackendSupport) -> str:
    """``DeepEP: Ampere, Hopper, Blackwell B200/B300 (not GB200/GB300 NVL72)``."""
    archs = ", ".join(architecture_name(m) for m in entry.majors)
    systems = "incl. GB200/GB300 NVL72" if entry.nvl72 else "B200/B300 (not GB200/GB300 NVL72)"
    return f"{entry.label}: {archs} {systems}"


def support_on(entry: BackendSupport, target: GpuTarget) -> tuple[bool | None, str]:
    """``True``/``False``, or ``None`` when the target cannot tell (Blackwell of unknown system)."""
    if target.capability is None:  # not target.known
        return None, "target GPU unknown: support not checked"
    if target.capability[0] not in entry.majors:
        return False, f"{entry.applicable}. Current GPU: {_current(target)}"
    if target.nvl72 and not entry.nvl72:
        return False, f"{entry.applicable} (not GB200/GB300 NVL72). Current GPU: {_current(target)}"
    board = _board_support(entry, target)
    if board is not None:
        return board
    if entry.nvl72 or target.nvl72 is False:
        return True, f"{entry.label} supports {target.architecture}" + (" incl. NVL72" if target.nvl72 else "")
    return None, f"{describe_support(entry)}; whether the target is an NVL72 system is unknown"


def _board_support(entry: BackendSupport, target: GpuTarget) -> tuple[bool, str] | None:
    """The verdict of ``entry.blackwell_boards`` on a named Blackwell target; ``None`` where they do
    not decide (no such list, another architecture, or a capability without a name)."""
    if (
        entry.blackwell_boards is None
        or target.capability is None
        or target.capability[0] != BLACKWELL_MAJOR
        or not target.name
    ):
        return None
    found = gpu_type(target.name)
    if found is None or found.name not in entry.blackwell_boards:
        return False, f"{entry.applicable}. Current GPU: {_current(target)}"
    return True, f"{entry.label} supports {found.name}"


def _current(target: GpuTarget) -> str:
    """``NVIDIA GB200 (compute capability 10.0)``."""
    if target.capability is None:
        return f"{target.name or 'GPU'} (compute capability unknown)"
    major, minor = target.capability
    return f"{target.name or 'GPU'} (compute capability {major}.{minor})"


def flex_backend_support() -> dict[str, BackendSupport]:
    """Flex backend -> the GPUs it supports: the ``gpus`` of every flex dispatch path
    (``models/dispatch/``). The ``applicable`` and ``supported`` sentences are Megatron-Bridge's own (its
    selection warning and its validation error), kept word for word so that scripts matching on them
    keep working."""
    return {p.name: p.gpus for p in paths_of("flex") if p.gpus is not None}


FLEX_BACKEND_SUPPORT: dict[str, BackendSupport] = flex_backend_support()
"""The support table as the registry lists it at import (:func:`flex_backend_support`)."""


def backend_support(backend: str | None, target: GpuTarget) -> tuple[bool | None, str]:
    """Whether ``backend`` runs on ``target``: ``True``, ``False``, or ``None`` when unknown."""
    table = flex_backend_support()
    if backend not in table:
        return None, f"no GPU-support table for backend {backend!r}"
    return support_on(table[backend], target)


def render_support_table() -> str:
    """Markdown table of GPU types x backends, for the docs page."""
    names = list(flex_backend_support())
    header = "| `-g` | capability | architecture | NVL72 | " + " | ".join(names) + " |\n|---|---|---|---|"
    header += "---|" * len(names) + "\n"
    rows = []
    for entry in GPU_TYPES.values():
        cells = ["yes" if backend_support(b, target_of(entry))[0] else "no" for b in names]
        major, minor = entry.capability
        rows.append(
            f"| `{entry.name}` | {major}.{minor} | {entry.architecture} | "
            f"{'yes' if entry.nvl72 else 'no'} | " + " | ".join(cells) + " |"
        )
    return header + "\n".join(rows) + "\n"
