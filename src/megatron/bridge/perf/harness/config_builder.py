"""Build the run's ``ConfigContainer`` from the harness arguments, one layer at a time.

Precedence (lowest first), each layer recorded in ``cfg.provenance``:

1. ``recipe``  - the function found by ``recipe_lookup`` (unrecorded keys come from here);
2. ``yaml``    - ``--config_file``;
3. ``flag``    - the harness flags (``-tp``, ``--max_steps``, ``--moe_a2a_overlap``, ...);
4. ``cli``     - positional dotted overrides ``section.field=value``;
5. ``computed``- only for keys no layer above set: the global batch scaled with the data-parallel
   size, the log directory, the gloo backend when ranks share a GPU, the learning-rate schedule
   scaled with a changed ``train.train_iters``.

Flags are turned into dotted keys and applied through the same typed override machinery as YAML
and CLI overrides, so a flag value is checked against the field type exactly like ``key=value``.

Importing this module loads neither torch nor megatron-core: the harness imports it before it has
read its arguments, and ``-h``, a mistyped flag or an unknown recipe are answered without them. The
override machinery, the resolution and the recipe itself load on first use (each such import says so).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron.bridge.perf.harness.argument_parser import COMPUTE_DTYPES, PLAIN_ALLTOALL
from megatron.bridge.perf.harness.harness_args import FLAG_FIELDS, HarnessArgs
from megatron.bridge.perf.harness.recipe_lookup import (
    RecipeChoice,
    layout_problem,
    lookup_recipe,
    minimum_world_size,
    scaled_global_batch_size,
)
from megatron.bridge.training.harness_surface import (
    MAX_WORLD_SIZE,
    RuleContext,
    inspect_checkpoint_dir,
    layout_within,
    read_field,
)
from megatron.bridge.utils.gpu_count import visible_gpu_count

if TYPE_CHECKING:
    from megatron.bridge.training.harness_surface import ConfigContainer, Resolution

DEFAULT_GPUS_PER_NODE = 8

OVERLAP_RELATED_KEYS: tuple[str, ...] = (
    "model.expert_model_parallel_size",
    "model.num_moe_experts",
    "model.moe_token_dispatcher_type",
    "model.moe_flex_dispatcher_backend",
    "model.moe_shared_expert_overlap",
    "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size",
    "model.recompute_granularity",
    "model.recompute_method",
    "model.mtp_num_layers",
    "model.cuda_graph_impl",
    "model.cuda_graph_scope",
    "model.moe_permute_fusion",
    "mixed_precision",
    "dist.distributed_backend",
)
"""Model/run fields the EP-overlap prerequisites read, shown by ``--dryrun`` with their source.
(The model/DDP copies of the overlap switches are derived from ``comm_overlap.*``, shown above them.)"""


class HarnessError(Exception):
    """A harness-level problem (bad recipe, layout, environment) with the exit code to use."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class BuiltConfig:
    """The merged (not yet finalized) config plus the facts the launcher and the report need."""

    cfg: ConfigContainer
    recipe: RecipeChoice
    num_gpus: int
    """GPUs (``-ng``); processes in CPU mode."""
    gpus_per_node: int
    procs_per_gpu: int
    target_gpu: str | None
    """GPU type validated against (``-g``, or ``dist.target_gpu``); ``None`` for CPU mode / not given."""
    cpu: bool
    notes: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        """Ranks of the job (several may share one GPU with gloo)."""
        return self.num_gpus * (1 if self.cpu else self.procs_per_gpu)

    @property
    def emulated(self) -> bool:
        """One process plays one rank of the ``num_gpus`` layout (``--emulate``)."""
        return self.cfg.emulation.world_size is not None

    @property
    def num_nodes(self) -> int:
        return 1 if self.cpu else -(-self.num_gpus // self.gpus_per_node)

    @property
    def log_dir(self) -> Path:
        """The run directory (``-l``, else the computed layer's new one: the builder always sets it)."""
        if self.cfg.logger.log_dir is None:
            raise ValueError("logger.log_dir is unset: the config builder's computed layer sets it")
        return Path(self.cfg.logger.log_dir)


# --------------------------------------------------------------------------------------------- layers
def nest(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` (the mapping form the override machinery takes)."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def apply_layer(cfg: ConfigContainer, values: Mapping[str, Any] | Sequence[str], source: str) -> ConfigContainer:
    """Apply dotted values (mapping or ``key=value`` strings) as layer ``source``; typed, all errors."""
    if not values:
        return cfg
    # Deferred: the override machinery imports the configuration classes (torch and megatron-core).
    from megatron.bridge.training.harness_surface import apply_overrides

    return apply_overrides(cfg, nest(values) if isinstance(values, Mapping) else list(values), source=source)


def flag_values(args: HarnessArgs) -> dict[str, Any]:
    """Dotted key -> value for every flag that was given (``None`` means not given)."""
    values = {key: getattr(args, dest) for dest, key in FLAG_FIELDS.items() if getattr(args, dest, None) is not None}
    if args.compute_dtype is not None:
        values["mixed_precision"] = COMPUTE_DTYPES[args.compute_dtype]
    if args.moe_flex_dispatcher_backend is not None:
        values.update(flex_dispatcher_values(args.moe_flex_dispatcher_backend))
    if args.gpu == "cpu":
        values["dist.device"] = "cpu"
    elif args.gpu is not None:
        values["dist.target_gpu"] = args.gpu  # validation (and the workers) check against this GPU
    if args.profile:
        values["profiling.use_pytorch_profiler"] = True
    if args.log_dir is not None:
        values["logger.log_dir"] = str(Path(args.log_dir).resolve())
    if args.network is not None:
        values["emulation.network"] = args.network
    if args.emulate_rank is not None:
        values["emulation.rank"] = args.emulate_rank
    return values


def emulation_values(args: HarnessArgs, num_gpus: int) -> dict[str, Any]:
    """``--emulate``: the emulated world is the ``-ng`` layout, ``-gn`` GPUs to a node (else the
    network preset's)."""
    if not args.emulate:
        return {}
    values: dict[str, Any] = {"emulation.world_size": num_gpus}
    if args.gpus_per_node is not None:
        values["emulation.gpus_per_node"] = args.gpus_per_node
    return values


def dispatch_launch_values(cfg: ConfigContainer, given: int | None, launch_gpus_per_node: int) -> dict[str, Any]:
    """The settings the dispatch path the config asks for takes from the launch, where no layer set
    them (the node-aware dispatcher's ``model.torch_native_gpus_per_node``: ``-gn``, else the emulated
    network's GPUs per node, else the launch's); other paths get nothing (the settings would have no
    effect). The paths say what they take (``models/dispatch/``)."""
    # Deferred: the dispatch registry lives under the models package, which imports megatron-core.
    from megatron.bridge.models.dispatch.dispatch_path import LaunchFacts
    from megatron.bridge.models.dispatch.path_registry import launch_values

    return launch_values(cfg, LaunchFacts(gpus_per_node=given, launch_gpus_per_node=launch_gpus_per_node))


def flex_dispatcher_values(backend: str) -> dict[str, Any]:
    """Model fields of ``--moe_flex_dispatcher_backend``: the dispatcher choice of
    ``dispatcher_fields`` (flex with the backend, or plain alltoall). Whether the backend runs on the
    target GPU is checked with every other rule when the config is resolved."""
    # Deferred: the flex helpers import the configuration classes (torch and megatron-core).
    from megatron.bridge.training.harness_surface import dispatcher_fields

    chosen = dispatcher_fields(None if backend == PLAIN_ALLTOALL else backend)
    return {f"model.{name}": value for name, value in chosen.items()}


def sizes_within_ranges(cfg: ConfigContainer) -> bool:
    """Whether every parallel size is inside its range: the harness's GPU-count arithmetic divides by
    them, so with a zero or negative size it is skipped and validation reports the range instead
    (with every other problem, never a ``ZeroDivisionError``)."""
    return layout_within(cfg, RuleContext())


WORLD_SIZE_RULE = "world-size-bounded"
"""Rule id of the harness's bound on the job's rank count."""


def world_size_problem(built: BuiltConfig, args: HarnessArgs) -> str:
    """Why a job of ``built.world_size`` ranks is refused: more than any job has (a typo, or a layout
    whose smallest GPU count is absurd when ``-ng`` is not given)."""
    m = built.cfg.model
    return (
        f"[{WORLD_SIZE_RULE}] the job would have {built.world_size} ranks, more than any training job has "
        f"(at most {MAX_WORLD_SIZE}): a larger count is a typo\n"
        f"    given: -ng={args.num_gpus}, --procs_per_gpu={built.procs_per_gpu}, "
        f"-tp={m.tensor_model_parallel_size}, -pp={m.pipeline_model_parallel_size}, -cp={m.context_parallel_size}, "
        f"-ep={m.expert_model_parallel_size}, -et={m.expert_tensor_parallel_size}\n"
        "    fix: give a smaller -ng (without -ng the layout's smallest GPU count is used), or smaller parallel sizes"
    )


def computed_values(
    cfg: ConfigContainer, recipe: RecipeChoice, recipe_cfg: ConfigContainer, world_size: int, procs_per_gpu: int
) -> dict[str, Any]:
    """Values for keys no user layer set (global batch scaling, log dir, gloo for shared GPUs)."""
    values: dict[str, Any] = {}
    given = cfg.provenance
    if "train.global_batch_size" not in given and not recipe.gpu_specific and sizes_within_ranges(cfg):
        gbs = scaled_global_batch_size(
            recipe_cfg.train.global_batch_size, recipe_cfg, recipe.reference_num_gpus, cfg, world_size
        )
        if gbs != cfg.train.global_batch_size:
            values["train.global_batch_size"] = gbs
    if cfg.logger.log_dir is None:
        # Deferred: the metrics module is the ranks' logger and imports torch and megatron-core.
        from megatron.bridge.training.harness_surface import default_log_dir

        values["logger.log_dir"] = default_log_dir(recipe.function_name.removesuffix("_config"))
    if procs_per_gpu > 1 and cfg.dist.distributed_backend is None and cfg.dist.device != "cpu":
        values["dist.distributed_backend"] = "gloo"
    return values


RESUMED_SCHEDULE_NOTE = (
    "resuming: the learning-rate and weight-decay schedule continue as saved in the checkpoint "
    "(megatron-core's use_checkpoint_opt_param_scheduler): optimizer.lr/min_lr/weight_decay and the "
    "scheduler.* lengths and style of this config are not used"
)


def schedule_values(
    cfg: ConfigContainer, recipe_cfg: ConfigContainer, resuming: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """Learning-rate schedule lengths scaled with a changed ``train.train_iters`` (``--max_steps``).

    A recipe's warm-up and decay lengths are written for its own run length. When a layer changes
    ``train.train_iters`` and leaves the schedule fields alone, the decay (when it spans the
    recipe's run or more) and the warm-up are scaled by the same factor, so the run gets the
    recipe's schedule shape instead of e.g. decaying over the first half and idling at the minimum
    learning rate after it. Returns the computed values and the notes that say what happened; a
    run that resumes from a checkpoint keeps the checkpoint's schedule, and the note says so.
    """
    if resuming:
        return {}, [RESUMED_SCHEDULE_NOTE]
    given, sched = cfg.provenance, recipe_cfg.scheduler
    old, new = recipe_cfg.train.train_iters, cfg.train.train_iters
    if new == old or not (isinstance(new, int) and isinstance(old, int) and new >= 1 and old >= 1):
        return {}, []
    values: dict[str, Any] = {}
    if "scheduler.lr_decay_iters" not in given and sched.lr_decay_iters is not None and sched.lr_decay_iters >= old:
        values["scheduler.lr_decay_iters"] = max(1, round(sched.lr_decay_iters * new / old))
    decay = values.get("scheduler.lr_decay_iters", cfg.scheduler.lr_decay_iters or new)
    if "scheduler.lr_warmup_iters" not in given and sched.lr_warmup_iters:
        values["scheduler.lr_warmup_iters"] = max(0, min(sched.lr_warmup_iters * new // old, decay - 1))
    notes = []
    if values:
        changes = ", ".join(f"{k.split('.')[-1]} {read_field(recipe_cfg, k)} -> {v}" for k, v in values.items())
        notes.append(
            f"train.train_iters {old} -> {new}: learning-rate schedule scaled with it ({changes}); set "
            "scheduler.lr_decay_iters / scheduler.lr_warmup_iters to keep other lengths"
        )
    if isinstance(decay, int) and decay < new:
        notes.append(
            f"scheduler.lr_decay_iters={decay} < train.train_iters={new}: iterations {decay + 1}-{new} run at "
            "the minimum learning rate (optimizer.min_lr)"
        )
    return values, notes


def _resumes(cfg: ConfigContainer) -> bool:
    load = cfg.checkpoint.load
    return inspect_checkpoint_dir(load).resumable if load else False


# --------------------------------------------------------------------------------------------- build
def _gpus_per_node(args: HarnessArgs, num_gpus: int, cpu: bool) -> int:
    if cpu:
        return num_gpus
    return args.gpus_per_node or min(num_gpus, DEFAULT_GPUS_PER_NODE)


def default_num_gpus(
    args: HarnessArgs, recipe: RecipeChoice, cfg: ConfigContainer, sizes_ok: bool, cpu: bool
) -> tuple[int, str | None]:
    """``-ng``, else its default and the note that says which: in CPU smoke mode the smallest process
    count the layout fits (a recipe's GPU count says nothing about CPU processes), else the recipe's
    reference GPU count (or the layout's smallest)."""
    if args.num_gpus:
        return args.num_gpus, None
    smallest = minimum_world_size(cfg) if sizes_ok else 1
    if cpu:
        return smallest, f"-ng not given: using {smallest} process(es), the smallest count the layout fits (CPU mode)"
    reference = recipe.reference_num_gpus
    if reference:
        return reference, f"-ng not given: using {reference} (the recipe's reference GPU count)"
    return smallest, f"-ng not given: using {smallest}, the smallest GPU count the layout fits"


def build_config(
    args: HarnessArgs,
    *,
    extra_overrides: Sequence[str] = (),
    log_dir: str | Path | None = None,
) -> BuiltConfig:
    """Recipe < ``--config_file`` < flags < dotted overrides (+ ``extra_overrides``) < computed.

    ``log_dir`` (used by sweeps) pins the job's log directory as a flag-layer value.
    Raises ``HarnessError`` (recipe/layout) or ``OverrideError``.
    """
    cpu = args.gpu == "cpu"
    try:
        recipe = lookup_recipe(args.model_family_name, args.model_recipe_name, args.task, args.num_gpus)
    except LookupError as exc:
        raise HarnessError(str(exc)) from None
    recipe_cfg = recipe.factory()
    cfg = copy.deepcopy(recipe_cfg)
    if args.config_file:
        # Deferred: the YAML reader imports the configuration classes (torch and megatron-core).
        from megatron.bridge.training.harness_surface import load_yaml

        cfg = apply_layer(cfg, load_yaml(args.config_file), "yaml")

    flags = flag_values(args)
    if log_dir is not None:
        flags["logger.log_dir"] = str(Path(log_dir).resolve())
    cfg = apply_layer(cfg, flags, "flag")
    cfg = apply_layer(cfg, [*args.overrides, *extra_overrides], "cli")

    cpu = cpu or (args.gpu is None and cfg.dist.device == "cpu")  # a config file or override chose CPU mode
    sizes_ok = sizes_within_ranges(cfg)
    num_gpus, count_note = default_num_gpus(args, recipe, cfg, sizes_ok, cpu)
    cfg = apply_layer(cfg, emulation_values(args, num_gpus), "flag")
    if args.emulate and args.procs_per_gpu > 1:
        raise HarnessError(
            "[emulate-one-process] --emulate trains one rank in one process; --procs_per_gpu "
            f"{args.procs_per_gpu} asks for several\n    fix: leave --procs_per_gpu out"
        )
    procs_per_gpu = 1 if cpu else args.procs_per_gpu
    gpus_per_node = _gpus_per_node(args, num_gpus, cpu)
    cfg = apply_layer(
        cfg,
        dispatch_launch_values(cfg, args.gpus_per_node, gpus_per_node),
        "flag" if args.gpus_per_node else "computed",
    )
    built = BuiltConfig(
        cfg=cfg,
        recipe=recipe,
        num_gpus=num_gpus,
        gpus_per_node=gpus_per_node,
        procs_per_gpu=procs_per_gpu,
        target_gpu=None if cpu else cfg.dist.target_gpu,
        cpu=cpu,
    )
    if count_note:
        built.notes.append(count_note)
    problem = layout_problem(cfg, built.world_size) if sizes_ok else None
    if problem:
        raise HarnessError(problem)
    if built.world_size > MAX_WORLD_SIZE:
        raise HarnessError(world_size_problem(built, args))
    if procs_per_gpu > 1 and cfg.dist.distributed_backend == "nccl":
        raise HarnessError(
            f"[procs-per-gpu-needs-gloo] --procs_per_gpu {procs_per_gpu} puts several ranks on one GPU, which "
            f"NCCL refuses\n    given: --procs_per_gpu={procs_per_gpu}, dist.distributed_backend='nccl'\n"
            "    fix: drop dist.distributed_backend=nccl (gloo is chosen then) or use --procs_per_gpu 1"
        )
    computed = computed_values(cfg, recipe, recipe_cfg, built.world_size, procs_per_gpu)
    schedule, schedule_notes = schedule_values(cfg, recipe_cfg, resuming=_resumes(cfg))
    built.cfg = apply_layer(cfg, {**computed, **schedule}, "computed")
    built.notes += schedule_notes
    if "train.global_batch_size" in computed:
        built.notes.append(
            f"global batch scaled with data-parallel size: {cfg.train.global_batch_size} -> "
            f"{computed['train.global_batch_size']} (recipe batch is for "
            f"{recipe.reference_num_gpus or minimum_world_size(recipe_cfg)} GPUs)"
        )
    return built


# --------------------------------------------------------------------------------------------- resolve
def rule_context(built: BuiltConfig) -> RuleContext:
    """Validation facts: world size of the job and the ``-g`` target GPU (not this machine's)."""
    # Deferred: the resolution imports every rule table, the configuration and megatron-core.
    from megatron.bridge.training.harness_surface import default_rule_context

    return default_rule_context(built.world_size, target_gpu=built.target_gpu)


def resolution_of(built: BuiltConfig) -> Resolution:
    """The one resolution of the job's config; raises ``ConfigError`` listing every violation."""
    # Deferred: as in rule_context.
    from megatron.bridge.training.harness_surface import resolve_config

    return resolve_config(built.cfg, ctx=rule_context(built)).raise_for_errors()


def resolve(built: BuiltConfig) -> ConfigContainer:
    """The finalized config of the job (what the ranks train); raises like :func:`resolution_of`."""
    return resolution_of(built).trained


def source_of(key: str, merged: ConfigContainer, resolved: ConfigContainer) -> str:
    """Which layer set ``key``: the recorded one, ``computed`` if resolving changed it, else ``recipe``."""
    recorded = resolved.provenance.get(key) or merged.provenance.get(key)
    if recorded:
        return recorded
    try:
        return "computed" if read_field(merged, key) != read_field(resolved, key) else "recipe"
    except AttributeError:
        return "recipe"


def effective_values(built: BuiltConfig, resolution: Resolution) -> list[tuple[str, Any, str, str]]:
    """``(key, value, source, detail)`` for every overlap switch and overlap-related field."""
    rows = [(v.key, v.value, v.source, v.detail) for v in resolution.values.values()]
    for key in OVERLAP_RELATED_KEYS:
        try:
            value = read_field(resolution.effective, key)
        except AttributeError:
            continue
        rows.append((key, value, source_of(key, built.cfg, resolution.effective), ""))
    return rows


def format_effective_rows(rows: Sequence[tuple[str, Any, str, str]]) -> str:
    """Aligned ``key = value  [source: detail]`` lines."""
    width = max(len(r[0]) for r in rows) if rows else 0
    return "\n".join(f"  {k:<{width}} = {v!r}  [{s}{': ' + d if d else ''}]" for k, v, s, d in rows)


def environment_summary(built: BuiltConfig) -> str:
    """One line: recipe, GPUs, nodes, ranks, target."""
    mode = "CPU smoke mode (gloo)" if built.cpu else f"target GPU {built.target_gpu or 'unspecified'}"
    share = f", {built.procs_per_gpu} ranks per GPU" if built.procs_per_gpu > 1 else ""
    if built.emulated:
        e = built.cfg.emulation
        return (
            f"recipe {built.recipe.qualified_name}; EMULATED world of {built.num_gpus} GPUs: one process "
            f"{'on the CPU' if built.cpu else 'on one GPU'} plays rank {e.rank}, the others are played by "
            f"symmetry; communication times are MODELED by network {e.network!r}, not measured; {mode}"
        )
    return (
        f"recipe {built.recipe.qualified_name}; {built.num_gpus} {'processes' if built.cpu else 'GPUs'} on "
        f"{built.num_nodes} node(s){share}; world size {built.world_size}; {mode}"
    )


def gpus_visible() -> int:
    """GPUs this process can see (0 without CUDA); does not need a process group."""
    return visible_gpu_count()
