"""Flex token-dispatcher backends (DeepEP, HybridEP, NCCL EP): Megatron-Bridge's selection and check helpers.

:func:`apply_flex_dispatcher_backend` selects a dispatcher on a model config and
:func:`validate_flex_dispatcher_backend` checks one; both check the flex-dispatcher rules of the one
rule registry (the ones ``cfg.validate()`` checks) on a container holding that model config, for the
target GPU. Each backend is a flex dispatch path (``models/dispatch/``: its GPUs, packages and rules); the
support table and the rules are read in :mod:`megatron.bridge.training.config_stages.rules.flex_rules` and
re-exported here, where upstream scripts import them.

Setting ``moe_flex_dispatcher_backend`` alone does not activate flex dispatch: the dispatcher type
must be ``flex`` as well. A dispatcher choice therefore sets the fields :func:`dispatcher_fields`
lists, and a backend without the flex dispatcher is an error (``flex-backend-needs-flex-dispatcher``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Literal

import torch

from megatron.bridge.models.dispatch.path_registry import (
    FLEX_BACKENDS,
    configured_path,
    describe_dispatcher,
    probe_packages,
)
from megatron.bridge.models.gpt_provider import FlexBackend
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.config_stages.facts import gpu_catalog
from megatron.bridge.training.config_stages.facts.gpu_catalog import GpuTarget
from megatron.bridge.training.config_stages.rules.flex_rules import (
    FLEX_BACKEND_SUPPORT,
    FLEX_RULES,
    BackendSupport,
    backend_support,
    dispatcher_fields,
    render_support_table,
)
from megatron.bridge.training.config_stages.rules.registry import ALL_RULES
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext, check_rules
from megatron.bridge.training.errors import CommOverlapConfigError, Violation
from megatron.bridge.utils.host import current_host

logger = logging.getLogger(__name__)

Fallback = Literal["alltoall"] | None


class FlexDispatcherBackendError(CommOverlapConfigError):
    """The requested flex backend cannot run on the target GPU or machine (all problems listed)."""


class FlexGpuProbeError(FlexDispatcherBackendError, RuntimeError):
    """CUDA reports a GPU whose type could not be read, so the backend cannot be checked: a
    ``FlexDispatcherBackendError`` (the listed problem with its fix) and a ``RuntimeError``, the class
    of torch's CUDA errors that Megatron-Bridge's helpers let through (the original is chained)."""


FLEX_DISPATCHER_RULES: tuple[Rule, ...] = tuple(rule for rule in ALL_RULES if rule.group == "flex-dispatcher")
"""The registry's flex-dispatcher rules: what the helpers below check."""


def _with_choice(model_config: Any, choice: dict[str, Any]) -> Any:
    """A shallow copy of ``model_config`` with the dispatcher choice set (the original unchanged)."""
    chosen = copy.copy(model_config)
    for name, value in choice.items():
        setattr(chosen, name, value)
    return chosen


def flex_dispatcher_violations(
    model_config: Any,
    target: GpuTarget,
    *,
    packages: Mapping[str, bool] | None = None,
    gpu_host: bool | None = None,
) -> list[Violation]:
    """Every flex-dispatcher problem of ``model_config`` for ``target`` (errors and notes).

    ``gpu_host``: whether this process runs on a GPU machine (default: a GPU is visible). A package the
    configured backend needs (``deep_ep`` for DeepEP and HybridEP, Transformer Engine's NCCL EP module
    for NCCL EP) that does not import is an error there and a note on a CPU host (dry run);
    ``packages`` (module -> imports) answers for them, else the host is asked, only for the configured
    backend's packages.
    """
    if gpu_host is None:
        gpu_host = gpu_catalog.visible_gpu()[0] is not None
    if packages is None:
        configured = configured_path(model_config)
        packages = probe_packages(current_host(), (configured,) if configured is not None else ())
    ctx = RuleContext(
        device_capability=target.capability,
        device_name=target.name,
        cuda_available=gpu_host,
        packages=packages,
    )
    return check_rules(FLEX_DISPATCHER_RULES, ConfigContainer(model=model_config), ctx)


def validate_flex_dispatcher_backend(
    model_config: Any,
    *,
    device_capability: tuple[int, int] | None = None,
    device_name: str | None = None,
) -> list[Violation]:
    """Raise ``FlexDispatcherBackendError`` listing every problem; return the notes (warnings).

    Call it before the model is built: megatron-core only notices a missing ``deep_ep`` or NCCL EP
    when it builds the MoE layer. Given no target GPU, a flex backend is checked against the GPU this
    process runs on (:func:`probe_target_gpu`); another dispatcher needs no GPU and none is probed.
    """
    target, gpu_host = _validation_target(model_config, device_capability, device_name)
    found = flex_dispatcher_violations(model_config, target, gpu_host=gpu_host)
    errors = [v for v in found if v.severity == "error"]
    if errors:
        raise FlexDispatcherBackendError(errors, title="flex dispatcher cannot run as configured")
    for note in found:
        logger.warning("flex dispatcher: %s", note.format())
    return found


def _validation_target(
    model_config: Any, device_capability: tuple[int, int] | None, device_name: str | None
) -> tuple[GpuTarget, bool | None]:
    """The GPU ``validate_flex_dispatcher_backend`` checks and whether this process runs on a GPU
    machine: the arguments (the machine: the visible GPU), else, with a flex backend configured, the
    GPU this process runs on (a GPU machine when one was found), else none (nothing GPU-specific)."""
    if device_capability is not None or device_name is not None:
        return gpu_catalog.resolve_gpu_target(device_capability, device_name), None
    backend = getattr(model_config, "moe_flex_dispatcher_backend", None)
    if getattr(model_config, "moe_token_dispatcher_type", None) != "flex" or backend is None:
        return GpuTarget(), False
    target = probe_target_gpu(backend)
    return target, target.known


def _rank_zero() -> bool:
    """Whether this process logs the once-per-job notes (rank 0, or no process group yet)."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or (
        torch.distributed.get_rank() == 0
    )


def _is_dense(model_config: Any) -> bool:
    """A model without MoE layers (``num_moe_experts`` unset or 0): it has no token dispatcher."""
    return not getattr(model_config, "num_moe_experts", None)


def probe_target_gpu(backend: str | None) -> GpuTarget:
    """The GPU this process runs on (``current_host()``), for a selection or a check given no target GPU.

    The host's own probe answers first (``nvidia-smi`` unless CUDA is already initialised). When it
    cannot tell but the host counts a GPU, torch is asked once, and a failure there raises
    ``FlexGpuProbeError`` (the original error chained): the backend is never applied unchecked on a
    GPU machine. No GPU: an unknown target.
    """
    host = current_host()
    capability, name = host.gpu()
    if capability is not None:
        return dataclasses.replace(gpu_catalog.resolve_gpu_target(capability, name), source="visible GPU")
    if host.gpu_count() == 0:
        return GpuTarget()
    try:
        found = _target_of_properties(torch.cuda.get_device_properties(0))
    except Exception as exc:
        problem = _probe_failure(backend, exc)
        raise FlexGpuProbeError([problem], title="flex dispatcher cannot check the GPU") from exc
    return dataclasses.replace(found, source="visible GPU")


def _target_of_properties(props: Any) -> GpuTarget:
    """The target described by torch's device properties. The capability major must be a number;
    a minor or a name that is not one (a driver or a stand-in that leaves them out) counts as 0 and
    as no name, so the architecture still decides and an unknown system is reported as such."""
    major = props.major
    if not isinstance(major, int) or isinstance(major, bool):
        raise TypeError(f"compute capability major is {major!r}, not a number")
    minor = props.minor if isinstance(getattr(props, "minor", None), int) else 0
    name = props.name if isinstance(getattr(props, "name", None), str) else None
    return gpu_catalog.resolve_gpu_target((major, minor), name)


def _probe_failure(backend: str | None, exc: Exception) -> Violation:
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
    moe_flex_dispatcher_backend: str | None = None,
    *,
    device_capability: tuple[int, int] | None = None,
    device_name: str | None = None,
    fallback: Fallback = None,
) -> str | None:
    """Select a dispatcher on ``model_config``; return the backend in effect (``None`` = alltoall).

    Sets the fields of :func:`dispatcher_fields`. The choice is checked with the flex rules for
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
                "flex dispatcher: DeepEP and HybridEP are only applicable to MoE models (NCCL EP too); "
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
    chosen = _with_choice(model_config, choice)
    configured = configured_path(chosen)
    found = flex_dispatcher_violations(  # the packages are checked by validate, where the job runs
        chosen,
        target,
        packages={need.module: True for need in (configured.packages if configured else ())},
        gpu_host=target.source == "visible GPU",
    )
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


__all__ = [
    "FLEX_BACKENDS",
    "FLEX_BACKEND_SUPPORT",
    "FLEX_DISPATCHER_RULES",
    "FLEX_RULES",
    "BackendSupport",
    "FlexBackend",
    "FlexDispatcherBackendError",
    "FlexGpuProbeError",
    "apply_flex_dispatcher_backend",
    "backend_support",
    "describe_dispatcher",
    "dispatcher_fields",
    "flex_dispatcher_violations",
    "probe_target_gpu",
    "render_support_table",
    "validate_flex_dispatcher_backend",
]
