"""Turn a user's ``ConfigContainer`` into a resolved, validated one, in a fixed order, in one place."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Optional

import torch
from packaging.version import Version

from megatron.bridge.training.errors import (
    CommOverlapConfigError,
    ConfigValidationError,
    Violation,
)
from megatron.bridge.training.dispatch_rules import TORCH_NATIVE_DISPATCH_RULES
from megatron.bridge.training.kernel_rules import TORCH_NATIVE_KERNEL_RULES
from megatron.bridge.training.mixed_precision import apply_mixed_precision
from megatron.bridge.training.rules import RuleContext, check_rules
from megatron.bridge.training.validation import GENERAL_RULES
from megatron.bridge.utils.import_utils import have_deep_ep, transformer_engine_version

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

logger = logging.getLogger(__name__)


def default_rule_context(
    world_size: Optional[int] = None, target_gpu: Optional[str] = None, **overrides
) -> RuleContext:
    """Facts about this machine; ``world_size`` falls back to ``$WORLD_SIZE`` when set.

    The target GPU is ``target_gpu`` (a ``-g`` type such as ``h100``/``gb200``), else the visible
    GPU, else unknown (a CPU host validates what it can and says so).
    """
    from megatron.bridge.training.flex_dispatcher_backend import resolve_gpu_target, visible_gpu

    if world_size is None and os.environ.get("WORLD_SIZE"):
        world_size = int(os.environ["WORLD_SIZE"])
    visible_capability, _ = visible_gpu()
    target = resolve_gpu_target(device_name=target_gpu) if target_gpu else resolve_gpu_target()
    facts = dict(
        te_version=transformer_engine_version(),
        torch_version=Version(torch.__version__.split("+")[0]),
        world_size=world_size,
        device_capability=target.capability,
        device_name=target.name,
        cuda_available=visible_capability is not None,
        deep_ep_available=have_deep_ep(),
    )
    facts.update(overrides)
    return RuleContext(**facts)


def finalize_config(
    cfg: "ConfigContainer", world_size: Optional[int] = None, ctx: Optional[RuleContext] = None
) -> "ConfigContainer":
    """Resolve derived values on ``cfg`` (a private copy) and raise if any rule is broken.

    Order: precision flags, then overlap settings, then every rule at once, then megatron-core's
    own deferred ``__post_init__`` (which only runs once our rules have passed).
    """
    from megatron.bridge.training import comm_overlap

    ctx = ctx or default_rule_context(world_size, target_gpu=getattr(cfg.dist, "target_gpu", None))
    apply_mixed_precision(cfg)
    overlap_violations = comm_overlap.resolve_comm_overlap(cfg, ctx)
    violations: list[Violation] = list(overlap_violations) + check_rules(GENERAL_RULES + TORCH_NATIVE_DISPATCH_RULES + TORCH_NATIVE_KERNEL_RULES, cfg, ctx)
    for warning in (v for v in violations if v.severity != "error"):
        logger.warning("config: %s", warning.format())
    errors = [v for v in violations if v.severity == "error"]
    if errors:
        error_type = (
            CommOverlapConfigError
            if any(v in overlap_violations for v in errors)
            else ConfigValidationError
        )
        raise error_type(errors)
    run_megatron_post_init(cfg)
    return cfg


def run_megatron_post_init(cfg: "ConfigContainer") -> None:
    """Run megatron-core's deferred checks; turn its bare ``assert``s into a typed error."""
    try:
        cfg.model.finalize()
    except (AssertionError, ValueError) as exc:
        raise ConfigValidationError(
            [
                Violation(
                    rule="megatron-core-post-init",
                    fields=("model",),
                    values=(type(cfg.model).__name__,),
                    message=f"megatron-core rejected the model config: {exc}",
                    fix="change the model fields named in the message",
                )
            ]
        ) from exc
