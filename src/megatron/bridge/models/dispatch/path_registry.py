"""The dispatch paths, one line each, and everything the product reads from them.

A new path is a module in this package (its :class:`~megatron.bridge.models.dispatch.dispatch_path.DispatchPath`
as ``PATH``) and its line in :data:`DISPATCH_PATHS`; ``docs/extending.md`` says what each field does.
From the list come the model fields' choices (``GPTModelProvider.torch_native_dispatcher`` and
``moe_flex_dispatcher_backend``), the harness's ``--moe_flex_dispatcher_backend``, the rule tables
(``training/config_stages/rules/dispatch_path_rules.py``), the docs' support table, the start-up
``dispatcher:`` line, the torch-native layer's choice and construction (:func:`choose_dispatch`), the
package probes of the rule context (:func:`probe_packages`) and the emulation benchmark's dispatchers
(:func:`benchmark_arms`). The order of the list is the order of the choices and of the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from megatron.bridge.models.dispatch import (
    deepep,
    hybridep,
    megatron_allgather,
    megatron_alltoall,
    ncclep,
    node_aware,
    sorted_dispatch,
    sorted_nvshmem,
)
from megatron.bridge.models.dispatch.dispatch_path import (
    DispatchChoice,
    DispatchPath,
    DispatchRequest,
    LaunchFacts,
    PackageNeed,
    PathKind,
)
from megatron.bridge.models.dispatch.flex_common import describe_flex
from megatron.bridge.models.dispatch.sorted_dispatch import EP_TRANSPORTS

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from megatron.bridge.utils.host import Host

DISPATCH_PATHS: tuple[DispatchPath, ...] = (
    sorted_dispatch.PATH,
    sorted_nvshmem.PATH,
    megatron_alltoall.PATH,
    megatron_allgather.PATH,
    node_aware.PATH,
    deepep.PATH,
    hybridep.PATH,
    ncclep.PATH,
)
"""Every dispatch path, in the order the choices and rules list them."""

AUTO = "auto"
"""``model.torch_native_dispatcher=auto``: the path that :attr:`~DispatchPath.decides_auto` picks."""


def paths_of(kind: PathKind) -> tuple[DispatchPath, ...]:
    """The paths of one kind, in registry order."""
    return tuple(p for p in DISPATCH_PATHS if p.kind == kind)


def path_named(name: str | None) -> DispatchPath | None:
    """The path called ``name`` (``None``: no such path)."""
    return next((p for p in DISPATCH_PATHS if p.name == name), None)


def torch_native_dispatchers() -> tuple[str, ...]:
    """The values of ``model.torch_native_dispatcher``: ``auto``, then each path's, in registry order."""
    return (AUTO, *dict.fromkeys(p.torch_native_value for p in DISPATCH_PATHS if p.torch_native_value))


def flex_backends() -> tuple[str, ...]:
    """The values of ``model.moe_flex_dispatcher_backend``: the flex paths' names."""
    return tuple(p.name for p in paths_of("flex"))


TORCH_NATIVE_DISPATCHERS: tuple[str, ...] = torch_native_dispatchers()
FLEX_BACKENDS: tuple[str, ...] = flex_backends()


def package_needs() -> tuple[PackageNeed, ...]:
    """Every optional module a path needs, once each, in registry order."""
    return tuple(dict.fromkeys(need for p in DISPATCH_PATHS for need in p.packages))


def paths_needing(need: PackageNeed) -> tuple[DispatchPath, ...]:
    return tuple(p for p in DISPATCH_PATHS if need in p.packages)


def probe_packages(host: Host, paths: tuple[DispatchPath, ...] | None = None) -> dict[str, bool]:
    """Module -> whether it imports on ``host``, for the packages of ``paths`` (default: every path):
    what fills ``RuleContext.packages``."""
    needs = package_needs() if paths is None else tuple(dict.fromkeys(n for p in paths for n in p.packages))
    return {need.module: host.has_package(need.module) for need in needs}


def configured_path(model: Any) -> DispatchPath | None:
    """The megatron-core dispatcher a model config selects: its flex backend's path with
    ``moe_token_dispatcher_type=flex``, else the megatron path of its dispatcher type (``None``: a name
    no path has)."""
    if model.moe_token_dispatcher_type == "flex":
        return next((p for p in paths_of("flex") if p.name == model.moe_flex_dispatcher_backend), None)
    return next((p for p in paths_of("megatron") if p.token_dispatcher_type == model.moe_token_dispatcher_type), None)


def describe_dispatcher(model: Any) -> str:
    """Which dispatch path runs, for the start-up line and the overlap report:
    ``flex, backend ncclep (static shape, zero copy off, per-rank capacity factor 1.5, SMs: backend default)``."""
    path = configured_path(model)
    if path is not None and path.describe is not None:
        return path.describe(model)
    if model.moe_token_dispatcher_type == "flex" and model.moe_flex_dispatcher_backend is not None:
        return describe_flex(model)  # a backend no path has (its rule refuses it)
    return str(model.moe_token_dispatcher_type)


def prepare_dispatch(model: Any, torch_native_dispatchers: Sequence[str]) -> list[str]:
    """Every path's change to megatron-core's code for the process (:attr:`DispatchPath.prepare`), made
    where a layer runs the path and undone elsewhere, and the start-up lines of those made. A megatron
    path runs where it is configured and the model has MoE layers: in every layer of megatron's layer
    specs (no torch-native choices), else in a torch-native layer that kept megatron's dispatcher."""
    configured = configured_path(model) if model.num_moe_experts else None
    lines = []
    for path in DISPATCH_PATHS:
        if path.prepare is None:
            continue
        runs = path is configured and (
            not torch_native_dispatchers or path.torch_native_value in torch_native_dispatchers
        )
        line = path.prepare(model, runs)
        if line:
            lines.append(line)
    return lines


def _deciding_path(requested: str) -> DispatchPath | None:
    """The path whose ``choose`` answers ``requested`` (``auto``: the one that decides it)."""
    for path in DISPATCH_PATHS:
        asked = path.decides_auto if requested == AUTO else path.torch_native_value == requested
        if asked and path.choose is not None:
            return path
    return None


def choose_dispatch(
    config: Any, ep_size: int, tp_size: int, ep_group: dist.ProcessGroup | None, device: torch.device
) -> DispatchChoice:
    """The path, transport and reason of one torch-native MoE layer on this machine: the choice of the
    path ``config.torch_native_dispatcher`` asks for (``auto``: see ``sorted_dispatch.py``)."""
    requested = getattr(config, "torch_native_dispatcher", AUTO)
    transport = getattr(config, "torch_native_ep_transport", "auto")
    if requested not in torch_native_dispatchers():
        raise ValueError(f"torch_native_dispatcher={requested!r} is not one of {torch_native_dispatchers()}")
    if transport not in EP_TRANSPORTS:
        raise ValueError(f"torch_native_ep_transport={transport!r} is not one of {EP_TRANSPORTS}")
    path = _deciding_path(requested)
    if path is None or path.choose is None:  # a value whose paths cannot choose for a layer
        raise ValueError(f"torch_native_dispatcher={requested!r} has no dispatcher in choose_dispatch")
    return path.choose(DispatchRequest(config, ep_size, tp_size, ep_group, device))


def launch_values(cfg: Any, launch: LaunchFacts) -> dict[str, Any]:
    """Settings the harness fills in from the launch for the torch-native path the config asks for
    (dotted name -> value; none where a layer set them or the path takes none)."""
    asked = cfg.model.torch_native_dispatcher
    values: dict[str, Any] = {}
    for path in DISPATCH_PATHS:
        if path.launch_values is not None and path.torch_native_value == asked:
            values.update(path.launch_values(cfg, launch))
    return values


def benchmark_arms(gpus_per_node: int) -> dict[str, list[str]]:
    """The emulation benchmark's dispatcher arms (name -> harness arguments): every arm of every path
    the emulated world can run."""
    return {arm.name: arm.argv(gpus_per_node) for p in DISPATCH_PATHS if p.emulated for arm in p.benchmark}
