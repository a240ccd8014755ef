"""``-m/-mr/--task`` -> a recipe function, and the GPU-count arithmetic around it.

A recipe named ``<mr>_<task>_<ng>gpu_config`` in ``megatron.bridge.recipes.<family>`` is used when
it exists for the requested GPU count (its layout and batch are tuned for that count). Otherwise
the generic ``<mr>_<task>_config`` is used, its parallel layout must divide ``-ng``, and its global
batch is scaled with the data-parallel size the way Megatron-Bridge's harness does: the recipe's batch
is meant for the recipe's own reference GPU count.

A name is looked up in the family package's source first (:func:`declared_recipe_names`), so an
unknown ``-m``/``-mr`` is answered without importing the recipes, which import torch and
megatron-core (seconds); only a recipe that exists is imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import math
import pkgutil
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from megatron.bridge.training.harness_surface import did_you_mean, expert_parallel_span, model_parallel_size, short_text

if TYPE_CHECKING:
    from megatron.bridge.training.harness_surface import ConfigContainer

RECIPES_PACKAGE = "megatron.bridge.recipes"
_GPU_VARIANT = re.compile(r"^(?P<base>.+)_(?P<ng>\d+)gpu_config$")
LAYOUT_RULE = "layout-divides-gpu-count"
"""Rule id of the harness's check that the parallel layout divides the job's GPU count."""
FAMILY_RULE = "model-family-known"
"""Rule id of the harness's check that ``-m`` names one of the recipe packages."""


class RecipeLookupError(LookupError):
    """The requested recipe does not exist or does not fit the GPU count; the message lists options."""


@dataclass(frozen=True)
class RecipeChoice:
    """The recipe the harness will start from."""

    family: str
    function_name: str
    module: str
    factory: Callable[[], ConfigContainer]
    gpu_specific: bool
    reference_num_gpus: int | None
    """GPU count the recipe's global batch was written for (``None``: the layout's minimum)."""

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.function_name}"


def available_families() -> list[str]:
    """Recipe families: the sub-packages of ``megatron.bridge.recipes``."""
    package = importlib.import_module(RECIPES_PACKAGE)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg and not m.name.startswith("_"))


def declared_recipe_names(family: str) -> set[str] | None:
    """The public ``*_config`` names the family package binds (defines, imports or assigns), read from
    its ``__init__`` source without running it; ``None`` when the source cannot say (no source file,
    a star import, a module ``__getattr__``), and the package is then imported to find out."""
    spec = importlib.util.find_spec(f"{RECIPES_PACKAGE}.{family}")
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if name.endswith("_config") and not name.startswith("_")}


def recipe_functions(module: ModuleType) -> dict[str, Callable[[], ConfigContainer]]:
    """Public ``*_config`` callables of a family package."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if name.endswith("_config") and not name.startswith("_") and callable(obj)
    }


def _check_family(family: str) -> None:
    """Refuse a ``-m`` that is not on :func:`available_families` (``-m qwen.sub`` or ``-m ..training``
    is refused by its text, never tried as a module path); nothing is imported."""
    families = available_families()
    if family in families:
        return
    hint = did_you_mean(family, families, prefix="-m ")
    raise RecipeLookupError(
        f"[{FAMILY_RULE}] unknown model family {short_text(family, 80)!r} (-m); {hint + ' ' if hint else ''}"
        f"available: {', '.join(families)}"
    )


def describe_recipes(functions: Iterable[str]) -> str:
    """Human list of the recipes of a family: ``-mr`` / ``--task`` / GPU-specific variants."""
    lines = []
    for name in sorted(functions):
        m = _GPU_VARIANT.match(name)
        base = m.group("base") if m else name[: -len("_config")]
        recipe, _, task = base.rpartition("_")
        suffix = f" (only for -ng {m.group('ng')})" if m else ""
        lines.append(f"  -mr {recipe} --task {task}{suffix}    [{name}]")
    return "\n".join(lines)


def recipe_names(functions: Iterable[str]) -> dict[str, set[str]]:
    """``-mr`` name -> the ``--task`` values it has, from a family's recipe function names."""
    names: dict[str, set[str]] = {}
    for name in functions:
        m = _GPU_VARIANT.match(name)
        base = m.group("base") if m else name[: -len("_config")]
        recipe, _, task = base.rpartition("_")
        names.setdefault(recipe, set()).add(task)
    return names


def recipe_hint(recipe: str, task: str, functions: Iterable[str]) -> str:
    """What the user probably meant: the same ``-mr`` with another ``--task``, or close spellings."""
    names = recipe_names(functions)
    if recipe in names:
        return f"-mr {recipe} exists for --task {', '.join(sorted(names[recipe]))}, not --task {task}"
    with_task = [name for name, tasks in names.items() if task in tasks]
    return did_you_mean(recipe, with_task, prefix="-mr ") or did_you_mean(recipe, names, prefix="-mr ") or ""


def recipe_tasks() -> tuple[str, ...]:
    """The ``--task`` values some recipe of some family is written for, read from the families'
    sources as :func:`lookup_recipe` reads them (a family whose source cannot say is imported)."""
    tasks: set[str] = set()
    for family in available_families():
        names = declared_recipe_names(family)
        if names is None:
            names = set(recipe_functions(importlib.import_module(f"{RECIPES_PACKAGE}.{family}")))
        for recipe_tasks_of_name in recipe_names(names).values():
            tasks |= recipe_tasks_of_name
    return tuple(sorted(tasks))


def reference_num_gpus(factory: Callable) -> int | None:
    """GPU count a recipe is written for (its ``reference_num_gpus`` attribute, set by
    ``written_for_gpus``), else ``None`` (then the minimum the layout needs is assumed)."""
    explicit = getattr(factory, "reference_num_gpus", None)
    return int(explicit) if explicit else None


def lookup_recipe(family: str, recipe: str, task: str, num_gpus: int | None = None) -> RecipeChoice:
    """Find the recipe function for ``-m/-mr/--task`` (GPU-count variant first); the family is
    imported only when its source declares one of the names asked for."""
    _check_family(family)
    candidates = ([f"{recipe}_{task}_{num_gpus}gpu_config"] if num_gpus else []) + [f"{recipe}_{task}_config"]
    declared = declared_recipe_names(family)
    if declared is not None and not declared.intersection(candidates):
        raise RecipeLookupError(_not_found(family, recipe, task, candidates, declared))
    module = importlib.import_module(f"{RECIPES_PACKAGE}.{family}")
    functions = recipe_functions(module)
    for name in candidates:
        if name in functions:
            factory = functions[name]
            gpu_specific = name != candidates[-1]
            return RecipeChoice(
                family=family,
                function_name=name,
                module=module.__name__,
                factory=factory,
                gpu_specific=gpu_specific,
                reference_num_gpus=num_gpus if gpu_specific else reference_num_gpus(factory),
            )
    raise RecipeLookupError(_not_found(family, recipe, task, candidates, set(functions)))


def _not_found(family: str, recipe: str, task: str, candidates: list[str], names: set[str]) -> str:
    """Why none of ``candidates`` is among the family's recipe ``names``, with what exists."""
    variants = sorted(n for n in names if n.startswith(f"{recipe}_{task}_") and _GPU_VARIANT.match(n))
    hint = f"; GPU-count-specific variants exist: {', '.join(variants)}" if variants else ""
    close = "" if variants else recipe_hint(recipe, task, names)
    hint += f"; {close}" if close else ""
    head = f"no recipe {candidates[-1]!r} in {RECIPES_PACKAGE}.{family} (-m {family} -mr {recipe} --task {task}){hint}"
    return f"{head}{'' if head.endswith('?') else '.'}\nAvailable recipes:\n{describe_recipes(names)}"


def replica_gpus(cfg: ConfigContainer) -> int:
    """TP*PP*CP of a layout whose parallel sizes are positive integers (the harness sizes a layout only
    after its range rules passed; ``model_parallel_size`` is ``None`` for any other)."""
    span = model_parallel_size(cfg)
    if span is None:
        raise ValueError(
            "a parallel size is not a positive integer: its range rule reports it before the layout is sized"
        )
    return span


def minimum_world_size(cfg: ConfigContainer) -> int:
    """Smallest GPU count the layout fits: a multiple of TP*PP*CP and of ETP*EP*PP."""
    return math.lcm(replica_gpus(cfg), expert_parallel_span(cfg))


def fitting_gpu_counts(cfg: ConfigContainer, near: int) -> list[int]:
    """GPU counts the layout divides: the four smallest and the two around ``near`` (at most six,
    whatever ``near`` is: a message lists them)."""
    step = minimum_world_size(cfg)
    below = near // step
    multiples = {1, 2, 3, 4, below, below + 1} - {0}
    return [step * k for k in sorted(multiples)]


def _listed(counts: list[int]) -> str:
    """``2, 4, 6, 8, ..., 998, 1000``: the elision shows where counts were left out."""
    parts = [str(counts[0])]
    for previous, count in zip(counts, counts[1:]):
        parts += ["..."] if count - previous > counts[0] else []
        parts.append(str(count))
    return ", ".join(parts)


def layout_problem(cfg: ConfigContainer, num_gpus: int) -> str | None:
    """Why the layout does not fit ``num_gpus`` (naming the sizes that do), or ``None``."""
    m = cfg.model
    if num_gpus % replica_gpus(cfg) == 0 and num_gpus % expert_parallel_span(cfg) == 0:
        return None
    fits = _listed(fitting_gpu_counts(cfg, num_gpus))
    return (
        f"[{LAYOUT_RULE}] the layout TP={m.tensor_model_parallel_size} PP={m.pipeline_model_parallel_size} "
        f"CP={m.context_parallel_size} EP={m.expert_model_parallel_size} "
        f"ETP={m.expert_tensor_parallel_size} does not divide -ng {num_gpus}: TP*PP*CP="
        f"{model_parallel_size(cfg)} and ETP*EP*PP={expert_parallel_span(cfg)} must both divide it "
        "(every rank belongs to one model replica and one expert group)\n"
        f"    given: -ng={num_gpus}, -tp={m.tensor_model_parallel_size}, -pp={m.pipeline_model_parallel_size}, "
        f"-cp={m.context_parallel_size}, -ep={m.expert_model_parallel_size}, -et={m.expert_tensor_parallel_size}\n"
        f"    fix: GPU counts that fit: {fits} (or change -tp/-pp/-cp/-ep/-et)"
    )


def scaled_global_batch_size(
    recipe_gbs: int, recipe_cfg: ConfigContainer, reference_gpus: int | None, cfg: ConfigContainer, num_gpus: int
) -> int:
    """The recipe's global batch scaled from its reference data-parallel size to this run's.

    DP = GPUs / (TP*PP*CP). The recipe's batch belongs to ``reference_gpus`` with the recipe's
    layout; the result keeps the per-replica batch (and so the number of micro-batches) unchanged.
    """
    ref_gpus = reference_gpus or minimum_world_size(recipe_cfg)
    ref_dp = max(1, ref_gpus // replica_gpus(recipe_cfg))
    dp = max(1, num_gpus // replica_gpus(cfg))
    per_replica = max(1, recipe_gbs // ref_dp)
    return per_replica * dp
