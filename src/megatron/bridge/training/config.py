"""The configuration tree of a training run: dataclasses only, above every stage of the configuration.

Their methods (``ConfigContainer.resolve()``/``to_yaml()``/``from_yaml()``, ``CommOverlapConfig.finalize()``/
``setup()``) call the stages of :mod:`megatron.bridge.training.config_stages` when they run; no stage imports
this module at run time, and importing it loads the ``schema`` stage only.

Every setting has exactly one owner in this tree. Values that other layers need (for example the
sequence length the dataset builder uses, or the precision flags of the optimizer) are *derived*
from their owner when the tree is resolved, never copied back the other way; the megatron-core
fields that are such copies are listed in :mod:`megatron.bridge.training.config_stages.facts.ownership`.

``ConfigContainer.resolve()`` (and ``finalize()``/``validate()``, which return its finalized
config) works on a deep copy and then writes the effective values into the copies of the container
a user holds; everything a user sets (the owners) stays exactly as written, so an edit made after
one ``validate()`` is seen by the next one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.training.config_stages.schema import copy_records
from megatron.bridge.training.config_stages.schema.emulation_config import EmulationConfig
from megatron.bridge.training.config_stages.schema.mixed_precision_config import (
    MIXED_PRECISION_RECIPES,
    MixedPrecisionConfig,
)
from megatron.bridge.training.config_stages.schema.upstream_sections import RerunStateMachineConfig, ValidationConfig
from megatron.bridge.training.tokenizers.config import TokenizerConfig
from megatron.bridge.utils.strict_fields import StrictFields, make_strict, register_strict

if TYPE_CHECKING:
    from pathlib import Path

    from megatron.bridge.training.config_stages.resolution.finalize import Resolution
    from megatron.bridge.training.config_stages.resolution.overlap_resolution import EffectiveValue


@register_strict
class StrictOptimizerConfig(StrictFields, OptimizerConfig):
    """megatron-core's ``OptimizerConfig`` refusing unknown attributes (what a container holds)."""


@register_strict
class StrictDistributedDataParallelConfig(StrictFields, DistributedDataParallelConfig):
    """megatron-core's ``DistributedDataParallelConfig`` refusing unknown attributes."""


@dataclass(kw_only=True)
class TrainingConfig(StrictFields):
    """Loop length and batch shape."""

    train_iters: int = 10
    global_batch_size: int = 8
    micro_batch_size: int = 1
    eval_interval: int | None = None
    """Run evaluation every N iterations; ``None`` disables evaluation."""
    eval_iters: int = 0
    exit_duration_in_mins: float | None = None
    manual_gc: bool = False
    """Disable automatic Python GC and collect at fixed points (avoids random straggler steps)."""
    manual_gc_interval: int = 0


@dataclass(kw_only=True)
class SchedulerConfig(StrictFields):
    """Learning-rate and weight-decay schedule (megatron-core ``OptimizerParamScheduler``)."""

    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "cosine"
    lr_warmup_iters: int = 0
    lr_warmup_init: float = 0.0
    lr_decay_iters: int | None = None
    """``None`` decays over ``train.train_iters``."""
    start_weight_decay: float | None = None
    """``None`` uses ``optimizer.weight_decay``."""
    end_weight_decay: float | None = None
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"


def data_paths_from_alias(value: Any) -> list[str] | None:
    """``dataset.data_path`` as ``data_paths``: a string is one prefix, a list is a blend list."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        return [str(value)]
    return [str(v) for v in value]


@dataclass(kw_only=True)
class DatasetConfig(StrictFields):
    """Training data. Mock data (megatron-core ``MockGPTDataset``) when ``data_paths`` is ``None``.

    ``data_path`` is an alias of ``data_paths`` (Megatron-Bridge's name). The sequence length is
    owned by ``model.seq_length``; ``seq_length`` here is its copy.
    """

    data_paths: list[str] | None = None
    """Indexed GPT dataset prefixes (``.bin``/``.idx`` without suffix), optionally weighted
    as megatron's blend list: ``["0.3", "/data/a", "0.7", "/data/b"]``."""
    split: str = "969,30,1"
    num_workers: int = 2
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    mmap_bin_files: bool = True
    path_to_cache: str | None = None
    seq_length: int | None = None
    """A copy of ``model.seq_length`` (Megatron-Bridge scripts set both): the recipes and ``validate()``
    write the model's value here; a different value written directly is refused
    (``owned-field-set-directly``). ``None``: not written yet."""
    random_seed: int | None = None
    """Seed of the dataset's sample shuffling; ``None`` uses ``rng.seed``."""
    dataloader_type: Literal["single", "cyclic", "external"] = "single"
    """Megatron-Bridge's sampler choice; batches here are always ``single`` (consecutive slices), so
    another value is refused by ``validate()``."""
    num_dataset_builder_threads: int = 1
    """Megatron-Bridge's index-building threads; accepted only at 1 (the indices are built on one
    thread here)."""

    FIELD_ALIASES: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "data_path": ("data_paths", data_paths_from_alias),
    }
    """Another name -> (the field it writes, how its value becomes that field's value). Overrides
    and YAML accept the alias as Python does (the ``data_path`` property)."""

    @property
    def data_path(self) -> list[str] | None:
        """Alias of :attr:`data_paths`: one prefix (a string) or a blend list."""
        return self.data_paths

    @data_path.setter
    def data_path(self, value: str | list[str] | None) -> None:
        self.data_paths = data_paths_from_alias(value)

    @property
    def is_mock(self) -> bool:
        """True when no data paths are given: megatron-core's mock GPT dataset is used."""
        return not self.data_paths


GPTDatasetConfig = DatasetConfig
"""Megatron-Bridge's name of the dataset section: the same class."""


@dataclass(kw_only=True)
class LoggerConfig(StrictFields):
    """Console, summary and TensorBoard logging."""

    log_interval: int = 1
    log_dir: str | None = None
    """Directory for ``summary.json`` and TensorBoard events; ``None`` writes under ``runs/``."""
    tensorboard: bool = False
    tensorboard_dir: str | None = None
    """Directory for TensorBoard events; setting it turns TensorBoard on. ``None``: ``log_dir``."""
    steady_state_window: list[int] | None = None
    """First and last step of this run (1-based, inclusive) of the steady-state step-time window;
    ``None``: automatic, the run's steps after its first max(2, 10 %) (``telemetry/steady_window.py``)."""
    log_memory: bool = True


@dataclass(kw_only=True)
class CheckpointConfig(StrictFields):
    """megatron-core ``dist_checkpointing`` save/resume."""

    save: str | None = None
    load: str | None = None
    save_interval: int | None = None
    save_on_exit: bool = True
    """Save a final checkpoint at the end of training and on SIGTERM (needs ``save``)."""
    ckpt_format: Literal["torch_dist"] = "torch_dist"


@dataclass(kw_only=True)
class DistributedInitConfig(StrictFields):
    """Process-group set-up."""

    device: Literal["cuda", "cpu"] = "cuda"
    """``cpu`` is the CPU smoke mode: correctness only, never performance numbers."""
    distributed_backend: Literal["nccl", "gloo"] | None = None
    """``None``: NCCL on GPUs, gloo in CPU smoke mode."""
    distributed_timeout_minutes: int = 10
    target_gpu: str | None = None
    """GPU type the run is validated for (the harness's ``-g``: ``h100``, ``b200``, ``gb200``...).
    ``None`` uses the visible GPU; on a CPU host GPU-specific checks are reported as not checked."""
    use_gloo_process_groups: bool = True
    """Megatron-Bridge's switch for megatron-core's gloo groups, which are always created here: only
    ``True`` is accepted by ``validate()``."""
    lazy_mpu_init: bool = False
    """Megatron-Bridge's deferred parallel-state set-up; the groups are always initialised before
    the model is built here: only ``False`` is accepted by ``validate()``."""

    @property
    def effective_backend(self) -> str:
        """The backend the run will use."""
        if self.distributed_backend is not None:
            return self.distributed_backend
        return "gloo" if self.device == "cpu" else "nccl"


@dataclass(kw_only=True)
class RNGConfig(StrictFields):
    """Seeds."""

    seed: int = 1234
    data_parallel_random_init: bool = False
    te_rng_tracker: bool = False
    """Use Transformer Engine's RNG tracker for the model-parallel RNG states (needs TE)."""


@dataclass(kw_only=True)
class ProfilingConfig(StrictFields):
    """torch profiler capture of a few steps on a few ranks."""

    use_pytorch_profiler: bool = False
    use_host_profiler: bool = False
    """Count every host call of the window with Python's deterministic profiler (cProfile, C
    functions included): where a host-bound step's time goes (``telemetry/host_profile.py``)."""
    profile_step_start: int = 5
    profile_step_end: int = 6
    profile_ranks: list[int] = field(default_factory=lambda: [0])
    gpu_park_steps: list[int] = field(default_factory=list)
    """Steps (1-based) that start with the GPU parked for ``gpu_park_s`` (a sleep kernel), so the host
    has queued the whole forward+backward before the GPU starts it. Their ``gpu_work_s`` in
    ``summary.json`` is the forward+backward's GPU time with the host out of the way; next to
    ``gpu_fwd_bwd_s`` of the other steps it shows what the host costs. These steps are slow by
    the park, so they must come after ``logger.steady_state_window``."""
    gpu_park_s: float = 0.5
    """How long a parked step holds the GPU before its forward+backward (longer than the host needs
    to queue one)."""
    record_shapes: bool = False


MixedPrecisionName = Literal[tuple(MIXED_PRECISION_RECIPES)]  # type: ignore[valid-type]
"""Every precision recipe name (``mixed_precision.MIXED_PRECISION_RECIPES``)."""


_STRICT_SUB_CONFIGS = frozenset({"optimizer", "ddp"})
"""Sub-configs of megatron-core classes that a container makes refuse unknown attributes."""


@dataclass(kw_only=True)
class CommOverlapConfig(StrictFields):
    """User-facing overlap switches. ``None`` means "let the framework decide" (see OVERLAP_FIELDS).

    An explicit value always wins and is never silently changed: if it cannot be honoured,
    ``cfg.validate()`` raises ``CommOverlapConfigError`` naming the field and the fix.
    """

    tp_comm_overlap: bool | None = None
    """Overlap tensor-parallel communication with GEMMs (TE userbuffers; TP>=2, sequence parallel)."""
    tp_comm_overlap_cfg: dict[str, Any] | None = None
    """Per-GEMM userbuffer settings for TP overlap; ``None`` uses Transformer Engine's defaults."""
    tp_comm_bootstrap_backend: str | None = None
    """Bootstrap backend of the TP-overlap userbuffers (``nccl``, ``mpi``, ``gloo``)."""
    overlap_p2p_comm: bool | None = None
    """Overlap pipeline send/recv with compute (interleaved pipeline schedule only)."""
    batch_p2p_comm: bool | None = None
    """Batch pipeline send/recv into one call (excludes overlap_p2p_comm)."""
    overlap_grad_reduce: bool | None = None
    """Overlap data-parallel gradient reduce-scatter/all-reduce with the backward pass."""
    overlap_param_gather: bool | None = None
    """Overlap the distributed optimizer's parameter all-gather with the forward pass."""
    overlap_param_gather_with_optimizer_step: bool | None = None
    """Start the parameter all-gather of the first chunk inside the optimizer step."""
    align_param_gather: bool | None = None
    """Launch the param all-gathers of all pipeline stages together (interleaved pipelines)."""
    bucket_size: int | None = None
    """Gradient/parameter bucket size in bytes for the overlapped collectives."""
    defer_embedding_wgrad_compute: bool | None = None
    """Defer the output-embedding weight-gradient GEMMs to the pipeline flush."""
    wgrad_deferral_limit: int | None = None
    """How many micro-batches of embedding wgrad may be deferred (0 = all)."""
    overlap_moe_expert_parallel_comm: bool | None = None
    """Overlap the MoE expert-parallel dispatch/combine all-to-all with compute of another micro-batch."""
    delay_wgrad_compute: bool | None = None
    """Delay expert weight-gradient GEMMs so they overlap the combine all-to-all (needs EP overlap)."""
    data_parallel_size: int | None = None
    """Data-parallel size the computed overlap defaults are decided for. ``None``: from the world
    size (``validate(world_size=...)`` or ``WORLD_SIZE``). Given without a world size it stands in
    for one; given with one it must agree with the parallel layout."""

    def finalize(self) -> None:
        """Check the switches that need nothing but this object (types, bootstrap backend, DP size).

        Idempotent and non-destructive: the switches stay as written (``None`` keeps meaning
        "framework decides"), so a later ``setup``/``cfg.resolve()`` decides them from the whole
        config. Raises ``CommOverlapConfigError`` listing every problem.
        """
        # Deferred: the overlap rules and resolution are what importing a config must not load
        # (this module is above every stage of config_stages: it may call them, they never import it).
        from megatron.bridge.training.config_stages.resolution.overlap_lifecycle import finalize_switches

        finalize_switches(self)

    def setup(
        self, model_config: Any, optimizer_config: Any, ddp_config: Any, *, dist_config: Any | None = None
    ) -> dict[str, EffectiveValue]:
        """Write every switch's effective value onto the megatron-core configs that read it.

        The values come from the resolution's own per-switch functions, evaluated on these three
        configs, this object and ``comm_overlap.data_parallel_size`` (the world size is not known
        here); ``dist_config`` gives the process-group backend (default: NCCL on GPUs). This object
        is not changed. A copy (``ddp.overlap_grad_reduce``, ...) that was set directly to another
        value is refused, not overwritten. The prerequisites are checked by ``cfg.validate()``.
        Returns each switch's value and why.
        """
        # Deferred, as in finalize().
        from megatron.bridge.training.config_stages.resolution.overlap_lifecycle import setup_switches

        return setup_switches(self, model_config, optimizer_config, ddp_config, dist_config)


@dataclass(kw_only=True)
class ConfigContainer(StrictFields):
    """The whole run. ``finalize()`` returns a resolved, validated copy; ``validate()`` too."""

    model: GPTModelProvider
    train: TrainingConfig = field(default_factory=TrainingConfig)
    optimizer: OptimizerConfig = field(default_factory=StrictOptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    ddp: DistributedDataParallelConfig = field(default_factory=StrictDistributedDataParallelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistributedInitConfig = field(default_factory=DistributedInitConfig)
    rng: RNGConfig = field(default_factory=RNGConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    """``None`` (as Megatron-Bridge scripts pass it) means no profiling: the default section."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """Megatron-Bridge's evaluation section: ``eval_iters``/``eval_interval`` are ``train``'s; the
    other fields are accepted only at their defaults."""
    rerun_state_machine: RerunStateMachineConfig = field(default_factory=RerunStateMachineConfig)
    """Megatron-Bridge's rerun-state-machine section, accepted only at its defaults."""
    mixed_precision: MixedPrecisionName | MixedPrecisionConfig | None = "bf16_mixed"
    """Owner of the precision flags of model, optimizer and DDP (derived at finalize): a recipe name
    or a ``MixedPrecisionConfig``. ``None``: no precision recipe; the model's, optimizer's and
    DDP's own dtype flags stand as set."""
    comm_overlap: CommOverlapConfig = field(default_factory=CommOverlapConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    """One rank of an N-GPU layout trained in this process against a network model (off by default)."""
    provenance: dict[str, str] = field(default_factory=dict)
    """Dotted key -> the layer that set it (``yaml``, ``flag``, ``cli``). Unlisted keys come from
    the recipe or a default; the resolved copy also marks ``computed`` values."""

    def __setattr__(self, name: str, value: Any) -> None:
        """Unknown names are refused; megatron-core optimizer/DDP configs become their strict kind;
        a ``validation`` section is attached to this container's ``train``."""
        if name in _STRICT_SUB_CONFIGS:
            value = make_strict(value)
        elif name == "profiling" and value is None:
            value = ProfilingConfig()
        elif name == "validation" and isinstance(value, ValidationConfig):
            value = value.attached_to(self)
        super().__setattr__(name, value)

    def __deepcopy__(self, memo: dict[int, Any]) -> ConfigContainer:
        """A deep copy whose sections keep the record of what resolution wrote into their copies."""
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        for name, value in vars(self).items():
            object.__setattr__(copied, name, copy.deepcopy(value, memo))
        for name, value in vars(self).items():
            copy_records.follow_copy(value, vars(copied)[name])
        return copied

    def __repr__(self) -> str:
        """One line: model class, layout, batch, precision and the main overlap switches (the full
        tree: ``print(cfg.to_yaml())``)."""
        try:
            return _short_repr(self)
        except Exception:  # a half-built container still has a repr
            return f"<{type(self).__name__} (incomplete)>"

    def resolve(self, world_size: int | None = None) -> Resolution:
        """Resolve once: the effective config, each overlap value and its source, the start-up
        report and the finalized config; raise a typed error listing all problems.

        ``world_size`` enables the checks that need the data-parallel size; ``None`` reads
        ``WORLD_SIZE`` from the environment and skips them when it is unset. On success the
        megatron-facing copies of this container (``model.overlap_moe_expert_parallel_comm``,
        ``ddp.delay_wgrad_compute``, the precision flags, ...) receive the effective values. Asked
        again with nothing changed, it returns the same resolution.
        """
        # Deferred: the resolution brings every rule table and the GPU catalogue, which importing
        # the configuration dataclasses must not.
        from megatron.bridge.training.config_stages.resolution.finalize import resolve_container

        return resolve_container(self, world_size=world_size)

    def finalize(self, world_size: int | None = None) -> ConfigContainer:
        """Return a resolved and validated deep copy; raise a typed error listing all problems."""
        return self.resolve(world_size=world_size).config

    def validate(self, world_size: int | None = None) -> ConfigContainer:
        """Finalize and validate without a GPU or a process group; returns the resolved copy."""
        return self.finalize(world_size=world_size)

    def to_yaml(self, path: str | Path | None = None) -> str:
        """Serialize to YAML (and write it to ``path`` when given): the owners, not their copies."""
        # Deferred: YAML I/O reads the ownership table, which belongs to the resolution.
        from megatron.bridge.training.config_stages.reading.yaml_io import config_to_yaml

        return config_to_yaml(self, path)

    @classmethod
    def from_yaml(cls, path: str | Path, sha256: str | None = None) -> ConfigContainer:
        """Load a container written by :meth:`to_yaml` (with ``sha256``: only the file of that digest)."""
        # Deferred, as in to_yaml().
        from megatron.bridge.training.config_stages.reading.yaml_io import container_from_dict, load_yaml

        return container_from_dict(cls, load_yaml(path, sha256))


_REPR_SWITCHES: tuple[tuple[str, str], ...] = (
    ("ep_overlap", "comm_overlap.overlap_moe_expert_parallel_comm"),
    ("delay_wgrad", "comm_overlap.delay_wgrad_compute"),
    ("grad_reduce", "comm_overlap.overlap_grad_reduce"),
    ("param_gather", "comm_overlap.overlap_param_gather"),
    ("tp_overlap", "comm_overlap.tp_comm_overlap"),
    ("shared_expert", "model.moe_shared_expert_overlap"),
)
"""The overlap switches ``repr(ConfigContainer)`` shows (``None``: decided at finalize)."""


def _short_repr(cfg: ConfigContainer) -> str:
    m, t = cfg.model, cfg.train
    precision = cfg.mixed_precision if not isinstance(cfg.mixed_precision, MixedPrecisionConfig) else "custom"
    overlap = cfg.comm_overlap or CommOverlapConfig()
    switches = []
    for label, dotted in _REPR_SWITCHES:
        section, _, name = dotted.partition(".")
        holder = overlap if section == "comm_overlap" else getattr(cfg, section)
        switches.append(f"{label}={getattr(holder, name)}")
    layout = (
        f"TP{m.tensor_model_parallel_size} PP{m.pipeline_model_parallel_size} "
        f"VPP{m.virtual_pipeline_model_parallel_size or '-'} CP{m.context_parallel_size} "
        f"EP{m.expert_model_parallel_size} ETP{m.expert_tensor_parallel_size or '-'}"
    )
    return (
        f"{type(cfg).__name__}(model={type(m).__name__}, layers={m.num_layers}, "
        f"experts={m.num_moe_experts}, layer_spec={m.layer_spec}, layout={layout}, "
        f"batch=global {t.global_batch_size} micro {t.micro_batch_size} seq {m.seq_length}, "
        f"train_iters={t.train_iters}, mixed_precision={precision}, "
        f"dispatcher={m.moe_token_dispatcher_type}, device={cfg.dist.device}, "
        f"overlap: {' '.join(switches)})"
    )


def __getattr__(name: str) -> Any:
    """``runtime_config_update``, which Megatron-Bridge scripts import from here, loaded on first use
    (it resolves the configuration, which importing these dataclasses must not)."""
    if name == "runtime_config_update":
        from megatron.bridge.training.config_stages.resolution.runtime_config import runtime_config_update

        return runtime_config_update
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
