"""What the harness (``megatron.bridge.perf``) may use of the training side, named in one place.

The harness builds a configuration, resolves and validates it for the target GPU, and launches the
training entry point; it reads a few facts of the layout, the checkpoint directory and the run's
files to do so. Each name below is looked up in its home when it is imported from here (PEP 562),
so ``run_script.py --help`` and a refused flag never load megatron-core. The same names are imported
again under ``TYPE_CHECKING`` (never at run time), so type checkers, IDEs and import graphs see each
edge and its type; a test holds the two lists equal. A test holds ``perf/`` to this module: a new
need of the harness is added here, in the table and the imports, or not at all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

SURFACE: dict[str, str] = {
    # build
    "ConfigContainer": "megatron.bridge.training.config",
    "apply_overrides": "megatron.bridge.training.utils.omegaconf_utils",
    "check_override_names": "megatron.bridge.training.config_stages.reading.override_names",
    "load_yaml": "megatron.bridge.training.utils.omegaconf_utils",
    "dispatcher_fields": "megatron.bridge.training.flex_dispatcher_backend",
    # resolve and validate
    "Resolution": "megatron.bridge.training.config_stages.resolution.finalize",
    "resolve_config": "megatron.bridge.training.config_stages.resolution.finalize",
    "default_rule_context": "megatron.bridge.training.config_stages.resolution.finalize",
    "RuleContext": "megatron.bridge.training.config_stages.schema.rule_base",
    "read_field": "megatron.bridge.training.config_stages.schema.rule_base",
    "ConfigError": "megatron.bridge.training.errors",
    "did_you_mean": "megatron.bridge.training.errors",
    "short_text": "megatron.bridge.training.config_stages.reading.shown",
    # facts of the layout and the target GPU
    "GPU_TYPES": "megatron.bridge.training.config_stages.facts.gpu_catalog",
    "MAX_WORLD_SIZE": "megatron.bridge.training.config_stages.facts.parallel_layout",
    "layout_within": "megatron.bridge.training.config_stages.facts.parallel_layout",
    "expert_parallel_span": "megatron.bridge.training.config_stages.facts.parallel_layout",
    "model_parallel_size": "megatron.bridge.training.config_stages.facts.parallel_layout",
    # launch facts: the entry point's files, signals and checkpoints
    "FAILURE_DIR": "megatron.bridge.training.entry",
    "STOP_SIGNALS": "megatron.bridge.training.loop.stop_request",
    "STOP_NOTE_ENV": "megatron.bridge.training.loop.stop_request",
    "default_log_dir": "megatron.bridge.training.telemetry.metrics",
    "HARNESS_REPORTS_ENV": "megatron.bridge.training.telemetry.results_table",
    "LAUNCH_ALLOCATOR_VAR": "megatron.bridge.training.config_stages.facts.graph_capture",
    "allocator_env": "megatron.bridge.training.config_stages.facts.graph_capture",
    # the run's results: the table a run ends with and its steady-state statistics
    "SteadyState": "megatron.bridge.training.telemetry.results_table",
    "format_results": "megatron.bridge.training.telemetry.results_table",
    "steady_state": "megatron.bridge.training.telemetry.results_table",
    "summary_steady_state": "megatron.bridge.training.telemetry.results_table",
    "CheckpointDir": "megatron.bridge.training.config_stages.facts.checkpoint_dir",
    "inspect_checkpoint_dir": "megatron.bridge.training.config_stages.facts.checkpoint_dir",
    "iteration_dir": "megatron.bridge.training.config_stages.facts.checkpoint_dir",
    "staged_iterations": "megatron.bridge.training.config_stages.facts.checkpoint_dir",
}
"""Name -> the module that defines it."""

if TYPE_CHECKING:  # SURFACE's names again, for type checkers, IDEs and import graphs (a test holds them equal)
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.config_stages.facts.checkpoint_dir import (
        CheckpointDir,
        inspect_checkpoint_dir,
        iteration_dir,
        staged_iterations,
    )
    from megatron.bridge.training.config_stages.facts.gpu_catalog import GPU_TYPES
    from megatron.bridge.training.config_stages.facts.graph_capture import LAUNCH_ALLOCATOR_VAR, allocator_env
    from megatron.bridge.training.config_stages.facts.parallel_layout import (
        MAX_WORLD_SIZE,
        expert_parallel_span,
        layout_within,
        model_parallel_size,
    )
    from megatron.bridge.training.config_stages.reading.override_names import check_override_names
    from megatron.bridge.training.config_stages.reading.shown import short_text
    from megatron.bridge.training.config_stages.resolution.finalize import (
        Resolution,
        default_rule_context,
        resolve_config,
    )
    from megatron.bridge.training.config_stages.schema.rule_base import RuleContext, read_field
    from megatron.bridge.training.entry import FAILURE_DIR
    from megatron.bridge.training.errors import ConfigError, did_you_mean
    from megatron.bridge.training.flex_dispatcher_backend import dispatcher_fields
    from megatron.bridge.training.loop.stop_request import STOP_NOTE_ENV, STOP_SIGNALS
    from megatron.bridge.training.telemetry.metrics import default_log_dir
    from megatron.bridge.training.telemetry.results_table import (
        HARNESS_REPORTS_ENV,
        SteadyState,
        format_results,
        steady_state,
        summary_steady_state,
    )
    from megatron.bridge.training.utils.omegaconf_utils import apply_overrides, load_yaml

__all__ = sorted(SURFACE)


def __getattr__(name: str) -> Any:
    if name not in SURFACE:
        raise AttributeError(f"{__name__} has no {name!r}: the harness's names are {', '.join(__all__)}")
    return getattr(importlib.import_module(SURFACE[name]), name)  # not kept: a patched home is seen


def __dir__() -> list[str]:
    return __all__
