"""The GPUs each flex token-dispatcher backend (DeepEP, HybridEP, NCCL EP) runs on, as data.

:data:`FLEX_BACKEND_SUPPORT` is read by the flex rules (``flex_rules.py``: ``flex-backend-known``,
``flex-backend-supported-on-gpu``), by ``apply_``/``validate_flex_dispatcher_backend`` and by the
support table on the overlap page (:func:`render_support_table`). A target is judged by its compute
capability, plus its system where the capability cannot tell: a GB200/GB300 NVL72 system has the
SM of a B200/B300 board, and DeepEP runs on the B200 and B300 boards only (the Blackwell GPUs
Megatron-Bridge's own check names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron.bridge.training.config_stages.facts.gpu_catalog import (
    GPU_TYPES,
    GpuTarget,
    architecture_name,
    gpu_type,
    target_of,
)

BLACKWELL_MAJOR = 10
"""Compute-capability major of the Blackwell data-center GPUs (B100/B200/B300, GB200/GB300)."""


@dataclass(frozen=True)
class BackendSupport:
    """Where one flex backend runs: capability majors, whether GB200/GB300 NVL72 systems count, and
    (where it runs on some Blackwell boards only) which."""

    name: str
    label: str
    majors: tuple[int, ...]
    nvl72: bool
    """Runs on GB200/GB300 NVL72 systems (same capability as B200/B300 boards)."""
    applicable: str
    """Where it runs, in the words of Megatron-Bridge's selection warning (scripts may match on them)."""
    supported: str
    """Where it runs, in the words of Megatron-Bridge's validation error (scripts may match on them)."""
    blackwell_boards: Optional[tuple[str, ...]] = None
    """The Blackwell GPU types (``-g`` names) it runs on when that is only some of them (DeepEP:
    ``b200``, ``b300``); ``None``: every Blackwell GPU its ``nvl72`` admits."""

    def describe(self) -> str:
        """``DeepEP: Ampere, Hopper, Blackwell B200/B300 (not GB200/GB300 NVL72)``."""
        archs = ", ".join(architecture_name(m) for m in self.majors)
        systems = "incl. GB200/GB300 NVL72" if self.nvl72 else "B200/B300 (not GB200/GB300 NVL72)"
        return f"{self.label}: {archs} {systems}"

    def support(self, target: GpuTarget) -> tuple[Optional[bool], str]:
        """``True``/``False``, or ``None`` when the target cannot tell (Blackwell of unknown system)."""
        if not target.known:
            return None, "target GPU unknown: support not checked"
        if target.capability[0] not in self.majors:
            return False, f"{self.applicable}. Current GPU: {_current(target)}"
        if target.nvl72 and not self.nvl72:
            return False, f"{self.applicable} (not GB200/GB300 NVL72). Current GPU: {_current(target)}"
        board = self._board_support(target)
        if board is not None:
            return board
        if self.nvl72 or target.nvl72 is False:
            return True, f"{self.label} supports {target.architecture}" + (" incl. NVL72" if target.nvl72 else "")
        return None, f"{self.describe()}; whether the target is an NVL72 system is unknown"

    def _board_support(self, target: GpuTarget) -> Optional[tuple[bool, str]]:
        """The verdict of :attr:`blackwell_boards` on a named Blackwell target; ``None`` where they
        do not decide (no such list, another architecture, or a capability without a name)."""
        if self.blackwell_boards is None or target.capability[0] != BLACKWELL_MAJOR or not target.name:
            return None
        entry = gpu_type(target.name)
        if entry is None or entry.name not in self.blackwell_boards:
            return False, f"{self.applicable}. Current GPU: {_current(target)}"
        return True, f"{self.label} supports {entry.name}"


def _current(target: GpuTarget) -> str:
    """``NVIDIA GB200 (compute capability 10.0)``."""
    major, minor = target.capability
    return f"{target.name or 'GPU'} (compute capability {major}.{minor})"


FLEX_BACKEND_SUPPORT: dict[str, BackendSupport] = {
    "deepep": BackendSupport(
        "deepep", "DeepEP", (8, 9, 10), nvl72=False,
        applicable="DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs",
        supported="DeepEP is supported for Ampere, Hopper, and Blackwell (B200/B300) GPUs",
        blackwell_boards=("b200", "b300"),
    ),
    "hybridep": BackendSupport(
        "hybridep", "HybridEP", (8, 9, 10), nvl72=True,
        applicable="HybridEP is only applicable for GB200, GB300 with NVL72 and for Ampere, Hopper, "
        "B200 and B300 GPUs",
        supported="HybridEP is supported for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and B300 GPUs",
    ),
    "ncclep": BackendSupport(
        "ncclep", "NCCL EP", (9, 10), nvl72=True,
        applicable="NCCL EP is only applicable to Hopper and Blackwell GPUs",
        supported="NCCL EP is supported for Hopper and Blackwell GPUs",
    ),
}
"""Flex backend (every name of :data:`FLEX_BACKENDS`) -> the GPUs it supports. The ``applicable``
and ``supported`` sentences are Megatron-Bridge's own (its selection warning and its validation
error), kept word for word so that scripts matching on them keep working."""


def backend_support(backend: Optional[str], target: GpuTarget) -> tuple[Optional[bool], str]:
    """Whether ``backend`` runs on ``target``: ``True``, ``False``, or ``None`` when unknown."""
    if backend not in FLEX_BACKEND_SUPPORT:
        return None, f"no GPU-support table for backend {backend!r}"
    return FLEX_BACKEND_SUPPORT[backend].support(target)


def render_support_table() -> str:
    """Markdown table of GPU types x backends, for the docs page."""
    names = list(FLEX_BACKEND_SUPPORT)
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
