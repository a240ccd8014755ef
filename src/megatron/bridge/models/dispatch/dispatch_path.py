"""One dispatch path: how an MoE layer's tokens reach their experts' GPUs, and everything the product
knows about it, in one record.

A :class:`DispatchPath` says what the path is called and of which kind it is, which model fields
ask for it and which are its own settings, which optional packages and GPUs it needs, its rules,
how it describes itself at start-up, how it picks and builds the torch-native layer's dispatcher,
and whether the emulated world can run it. The registry (``path_registry.py``) lists the paths; the
field choices, the harness's choices, the rule tables, the docs' support table, the start-up text,
the layer's construction, the package probes and the emulation benchmark's dispatchers are all read
from it.

The module imports nothing of the run: a path's ``choose`` and ``build`` import the layers they need
when they are called, so the configuration stages may read the registry on a CPU login node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from megatron.bridge.utils.rule_records import Rule, RuleContext

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

PathKind = Literal["torch_native", "megatron", "flex"]
"""``torch_native``: a dispatcher of this package, run by the torch-native MoE layer; ``megatron``:
megatron-core's own dispatcher (``moe_token_dispatcher_type`` alltoall or allgather); ``flex``: a
backend of megatron-core's flex dispatcher (``moe_flex_dispatcher_backend``)."""

PLAIN_ALLTOALL_TEXT = "plain alltoall (moe_flex_dispatcher_backend=null; harness: --moe_flex_dispatcher_backend None)"
"""How the rules' fixes name the way back to megatron-core's plain alltoall dispatcher."""


@dataclass(frozen=True)
class PackageNeed:
    """An optional module a path needs on the GPU machines, and the two rules that say so: an error on
    a GPU host where it does not import, a note on a CPU host (a dry run cannot tell for the cluster).
    The host is asked for it through ``current_host().has_package(module)``; one need shared by two
    paths (DeepEP and HybridEP both need ``deep_ep``) is one object, so its rules exist once."""

    module: str
    """The module to import (``deep_ep``, ``transformer_engine.pytorch.ep``); also how rules show it."""
    rule_id: str
    message: str
    fix: str
    note_id: str
    note_message: str
    note_fix: str


@dataclass(frozen=True)
class BackendSupport:
    """The GPUs a path runs on: capability majors, whether GB200/GB300 NVL72 systems count, and
    (where it runs on some Blackwell boards only) which. Judged against a target GPU by
    ``training/config_stages/rules/flex_gpu_support.py``."""

    name: str
    label: str
    majors: tuple[int, ...]
    nvl72: bool
    """Runs on GB200/GB300 NVL72 systems (same capability as B200/B300 boards)."""
    applicable: str
    """Where it runs, in the words of Megatron-Bridge's selection warning (scripts may match on them)."""
    supported: str
    """Where it runs, in the words of Megatron-Bridge's validation error (scripts may match on them)."""
    blackwell_boards: tuple[str, ...] | None = None
    """The Blackwell GPU types (``-g`` names) it runs on when that is only some of them (DeepEP:
    ``b200``, ``b300``); ``None``: every Blackwell GPU its ``nvl72`` admits."""


class TargetGpu(Protocol):
    """The target GPU as a rule reads it (the configuration's ``GpuTarget``)."""

    @property
    def known(self) -> bool: ...

    @property
    def capability(self) -> tuple[int, int] | None: ...

    def describe(self) -> str: ...


class RunFacts(Protocol):
    """What a path's rules may ask beyond the config's fields and the machine facts: answers only the
    configuration stages have (the layer implementation a run builds, its precision, its target GPU).
    ``models/`` sits below ``training/``, so these are handed to :attr:`DispatchPath.rules` instead of
    imported (``training/config_stages/rules/dispatch_path_rules.py`` hands them over)."""

    def layers_use_te(self, cfg: Any, ctx: RuleContext) -> bool: ...

    def uses_torch_native_layers(self, cfg: Any, ctx: RuleContext) -> bool: ...

    def low_precision(self, cfg: Any) -> bool: ...

    def target_gpu(self, ctx: RuleContext) -> TargetGpu: ...


@dataclass(frozen=True)
class DispatchRequest:
    """What a torch-native MoE layer asks when it picks its dispatcher: the model config, its EP and
    expert-TP sizes, the EP group and the device it runs on."""

    config: Any
    ep_size: int
    tp_size: int
    ep_group: dist.ProcessGroup | None
    device: torch.device

    @property
    def requested(self) -> str:
        """``model.torch_native_dispatcher``."""
        return getattr(self.config, "torch_native_dispatcher", "auto")


@dataclass(frozen=True)
class DispatchChoice:
    """Which path an MoE layer runs, over which transport, and why."""

    path: DispatchPath
    transport: str
    """What moves tokens between EP ranks (``none`` for one rank)."""
    sync_free: bool
    reason: str
    index_graph: bool = False
    """The sorted dispatcher's index computations replay from a CUDA graph (on GPUs; see
    ``models/torch_native/index_graph.py``), instead of launching their kernels one by one."""

    @property
    def dispatcher(self) -> str:
        """The ``model.torch_native_dispatcher`` value of the path (``sorted``, ``megatron``, ...)."""
        return self.path.torch_native_value or self.path.name

    def describe(self) -> str:
        """The start-up line of this choice, in the path's words."""
        if self.path.describe_choice is None:
            return f"{self.path.name} ({self.reason})"
        return self.path.describe_choice(self)

    def to_dict(self) -> dict:
        return dict(
            dispatcher=self.dispatcher,
            transport=self.transport,
            sync_free=self.sync_free,
            index_graph=self.index_graph,
            reason=self.reason,
        )


@dataclass(frozen=True)
class DispatcherBuild:
    """What a path's ``build`` gets: the torch-native MoE layer being built (megatron's dispatcher is
    in ``layer.token_dispatcher``), its config and the choice."""

    layer: Any
    config: Any
    choice: DispatchChoice


@dataclass(frozen=True)
class LaunchFacts:
    """What the harness knows of the launch that a path's settings may follow: ``-gn`` as given
    (``None``: not given) and the GPUs per node the launch uses."""

    gpus_per_node: int | None
    launch_gpus_per_node: int


@dataclass(frozen=True)
class BenchmarkArm:
    """A dispatcher arm of the emulation benchmark: its name and the harness overrides that select it
    (``{gpus_per_node}`` stands for the benchmark's GPUs per node)."""

    name: str
    overrides: tuple[str, ...] = ()

    def argv(self, gpus_per_node: int) -> list[str]:
        return [o.format(gpus_per_node=gpus_per_node) for o in self.overrides]


def no_rules(facts: RunFacts) -> tuple[Rule, ...]:
    """The rules of a path that has none of its own."""
    return ()


def fixed_rules(rules: tuple[Rule, ...]) -> Callable[[RunFacts], tuple[Rule, ...]]:
    """:attr:`DispatchPath.rules` of a path whose rules ask no :class:`RunFacts`."""
    return lambda facts: rules


@dataclass(frozen=True, eq=False)
class DispatchPath:
    """One dispatch path (see the module's docstring). Compared by identity: one object per path."""

    name: str
    """Registry key; the flex backend's name for a ``flex`` path, the arm name in benchmarks."""
    kind: PathKind
    summary: str
    """One line for the docs: what the path is."""
    token_dispatcher_type: str
    """megatron-core's ``moe_token_dispatcher_type`` it runs under (the torch-native dispatchers
    replace megatron's ``alltoall`` one)."""
    torch_native_value: str | None = None
    """The ``model.torch_native_dispatcher`` value that asks for it (paths of one value share it)."""
    decides_auto: bool = False
    """Its ``choose`` also answers ``model.torch_native_dispatcher=auto``."""
    fields: tuple[str, ...] = ()
    """The model fields that are its own settings."""
    packages: tuple[PackageNeed, ...] = ()
    gpus: BackendSupport | None = None
    """The GPUs it runs on, where that is a table (the flex backends); ``None``: wherever the layers run."""
    rules: Callable[[RunFacts], tuple[Rule, ...]] = no_rules
    describe: Callable[[Any], str] | None = None
    """The start-up ``dispatcher:`` text for a model config that selects it (megatron and flex paths)."""
    transports: tuple[str, ...] = ()
    """The ``DispatchChoice.transport`` values its choices carry (how a choice finds its path)."""
    choose: Callable[[DispatchRequest], DispatchChoice] | None = None
    """The torch-native layer's choice for a request that asks for :attr:`torch_native_value`."""
    describe_choice: Callable[[DispatchChoice], str] | None = None
    build: Callable[[DispatcherBuild], Any] | None = None
    """The layer's token dispatcher for a choice of this path; ``None``: megatron's stays."""
    prepare: Callable[[Any, bool], str | None] | None = None
    """Called at every model build with the model config and whether a layer runs this path: a change
    the path makes to megatron-core's code for the process, made or undone (``megatron_alltoall``: its
    chunk sort); returns the start-up line that says what changed (``None``: nothing)."""
    emulated: bool = False
    """The emulated world can run it (it plays every peer by symmetry)."""
    benchmark: tuple[BenchmarkArm, ...] = ()
    """Its arms in the emulation benchmark (``perf/benchmarks/emulation_benchmark.py``)."""
    launch_values: Callable[[Any, LaunchFacts], dict[str, Any]] | None = None
    """Settings the harness fills in from the launch where no layer set them (dotted name -> value)."""
