"""GPU types a run can be validated for, and how the target GPU is found.

The target GPU comes from the caller (the harness's ``-g`` GPU type, e.g. ``h100`` or ``gb200``),
else from the visible GPU, else it is unknown and only GPU-independent checks run (a dry run on a
CPU login node must not fail because the login node has no GPU).

Architecture is read from the compute capability, never from a name prefix. The only thing a
capability cannot tell is a B200/B300 board from a GB200/GB300 NVL72 system (same SM), which is
why the system name is kept beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megatron.bridge.utils.host import current_host

if TYPE_CHECKING:
    from megatron.bridge.training.config_stages.schema.rule_base import RuleContext


@dataclass(frozen=True)
class GpuType:
    """A GPU type the harness's ``-g`` accepts."""

    name: str
    capability: tuple[int, int]
    architecture: str
    nvl72: bool = False
    """Part of a GB200/GB300 NVL72 rack-scale system (multi-node NVLink domain)."""
    memory_gib: float | None = None
    """Memory of one GPU, GiB: the largest variant sold under the name (H100 NVL's 94 rather than
    SXM's 80), so that a memory check against it refuses only what fits no variant."""
    smallest_memory_gib: float | None = None
    """The smallest variant's memory, GiB, where it differs (H100 SXM's and PCIe's 80, A100's 40): a
    warning says what will likely not fit it."""


GPU_TYPES: dict[str, GpuType] = {
    "a100": GpuType("a100", (8, 0), "Ampere", memory_gib=80, smallest_memory_gib=40),
    "h100": GpuType("h100", (9, 0), "Hopper", memory_gib=94, smallest_memory_gib=80),
    "h200": GpuType("h200", (9, 0), "Hopper", memory_gib=141),
    "b200": GpuType("b200", (10, 0), "Blackwell", memory_gib=192),
    # B300/GB300 (Blackwell Ultra) report compute capability 10.3 (sm_103).
    "b300": GpuType("b300", (10, 3), "Blackwell", memory_gib=288),
    "gb200": GpuType("gb200", (10, 0), "Blackwell", nvl72=True, memory_gib=192),
    "gb300": GpuType("gb300", (10, 3), "Blackwell", nvl72=True, memory_gib=288),
}
"""``-g`` GPU types. B300/GB300 are listed as (10, 3): that is what the chips report."""


def gpu_memory_bytes(name: str | None) -> int | None:
    """Memory of one GPU of the type ``name`` (a ``-g`` type or a device name), ``None`` when the
    type is not in the table (nothing is then checked against it)."""
    entry = gpu_type(name) if name else None
    return None if entry is None or entry.memory_gib is None else int(entry.memory_gib * 2**30)


def smallest_gpu_memory_bytes(name: str | None) -> int | None:
    """Memory of the smallest variant of the type ``name`` (:func:`gpu_memory_bytes` where one size is sold)."""
    entry = gpu_type(name) if name else None
    smallest = entry.smallest_memory_gib if entry else None
    return int(smallest * 2**30) if smallest is not None else gpu_memory_bytes(name)


ARCHITECTURES: dict[int, str] = {8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell (consumer)"}
"""Compute-capability major -> architecture name."""


def architecture_name(major: int, minor: int = 0) -> str:
    """``Hopper`` for 9.x; ``sm_XY`` for a major this table does not name."""
    return ARCHITECTURES.get(major, f"sm_{major}{minor}")


@dataclass(frozen=True)
class GpuTarget:
    """The GPU a run is validated for, and where that knowledge came from."""

    capability: tuple[int, int] | None = None
    name: str | None = None
    nvl72: bool | None = None
    """``None``: unknown (a Blackwell capability without a system name)."""
    source: str = "unknown"
    """``argument``, ``visible GPU`` or ``unknown``."""

    @property
    def known(self) -> bool:
        """Whether anything is known about the target."""
        return self.capability is not None

    @property
    def architecture(self) -> str | None:
        """Ampere/Hopper/Blackwell/... from the capability major."""
        if self.capability is None:
            return None
        return architecture_name(*self.capability)

    def describe(self) -> str:
        """For messages: ``gb200 (10.0, Blackwell, NVL72; argument)``."""
        if self.capability is None:  # not self.known
            return "unknown (no GPU type given and no visible GPU)"
        major, minor = self.capability
        system = {True: ", NVL72", False: "", None: ", NVL72 unknown"}[self.nvl72]
        label = self.name or "GPU"
        return f"{label} ({major}.{minor}, {self.architecture}{system}; {self.source})"


def target_of(entry: GpuType) -> GpuTarget:
    """The validation target a ``-g`` type stands for."""
    return GpuTarget(entry.capability, entry.name, entry.nvl72, "argument")


_NVL72_NAME = re.compile(r"\bgb[23]00\b")


def gpu_type(name: str) -> GpuType | None:
    """The table entry for a ``-g`` value or a device name (``"NVIDIA GB200"`` -> ``gb200``)."""
    key = name.strip().lower()
    if key in GPU_TYPES:
        return GPU_TYPES[key]
    for token in re.findall(r"[a-z]+\d+", key):
        if token in GPU_TYPES:
            return GPU_TYPES[token]
    return None


def _nvl72_from_name(name: str | None, capability: tuple[int, int]) -> bool | None:
    if capability[0] != 10:
        return False
    if not name:
        return None
    entry = gpu_type(name)
    if entry is not None:
        return entry.nvl72
    return bool(_NVL72_NAME.search(name.lower())) or None


def visible_gpu() -> tuple[tuple[int, int] | None, str | None]:
    """Capability and name of GPU 0 of the machine decisions are made for (``current_host()``), or
    ``(None, None)`` on a machine without a usable GPU."""
    return current_host().gpu()


def resolve_gpu_target(
    device_capability: tuple[int, int] | None = None,
    device_name: str | None = None,
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
    capability: tuple[int, int] | None
    if device_capability is not None:
        capability = (device_capability[0], device_capability[1])  # a list from a record reads as the pair
    else:
        capability = entry.capability if entry else None
    if capability is None:
        return GpuTarget(name=device_name, source="unknown")
    label = entry.name if entry else device_name
    return GpuTarget(capability, label, _nvl72_from_name(device_name, capability), source)


def capability_at_least(capability: tuple[int, int] | None, minimum: tuple[int, int]) -> bool:
    """``capability >= minimum``; an unknown GPU refuses nothing (the rules about a GPU apply only
    where it is known)."""
    return capability is None or tuple(capability) >= minimum


def gpu_target_from_context(ctx: RuleContext) -> GpuTarget:
    """The target described by a ``RuleContext`` (``finalize`` already chose argument vs visible)."""
    return resolve_gpu_target(ctx.device_capability, ctx.device_name, detect=False)
