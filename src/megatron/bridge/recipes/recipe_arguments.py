"""Keyword arguments of the pretraining recipes, in Megatron-Bridge's names.

Megatron-Bridge's current pretraining recipes take no arguments (``cfg = recipe()``, then set
fields); its earlier ones (up to v0.2) took keyword arguments such as ``mock=True``,
``train_iters=...``, ``tensor_model_parallel_size=...``, ``dir=...``. Scripts of both kinds run here:
a recipe called without arguments is the recipe, and each keyword argument is either applied to the
fields it stands for (:data:`APPLIED`, with the combined ones in :func:`_apply_run_length`,
:func:`_apply_data`, :func:`_apply_run_dir` and :func:`_apply_tokenizer`) or refused with the reason
and what to do instead (:data:`REFUSED`). Refusals, a misspelt name and a positional argument are one
:class:`~megatron.bridge.utils.error_types.ArgumentError` (a ``TypeError``) listing every problem, raised
before a config is built. An argument given its Megatron-Bridge default that means "nothing"
(``None``, ``False``) is accepted everywhere: it asks for nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from megatron.bridge.training.config import ConfigContainer, data_paths_from_alias
from megatron.bridge.training.config_stages.facts.ownership import write_following_copies
from megatron.bridge.training.flex_dispatcher_backend import dispatcher_fields
from megatron.bridge.training.mixed_precision import get_mixed_precision_config
from megatron.bridge.utils.error_types import ArgumentError, Violation, did_you_mean

RECIPE_WARMUP_ITERS = 500
"""Learning-rate warm-up of the recipes, capped at a tenth of the run (``min(500, train_iters // 10)``)."""

DEFAULT_RUN_NAME = "default"
DEFAULT_BASE_DIR = "nemo_experiments"
"""Where ``name=`` without ``dir=`` puts a run (below the working directory), as Megatron-Bridge did."""

_TITLE = "the recipe cannot take these arguments"


def _field_setter(dotted: str) -> Callable[[ConfigContainer, Any], None]:
    """A setter of ``cfg.<section>.<field>``."""
    section, _, name = dotted.partition(".")

    def apply(cfg: ConfigContainer, value: Any) -> None:
        setattr(getattr(cfg, section), name, value)

    apply.__doc__ = f"Sets ``{dotted}``."
    return apply


def _set_precision(cfg: ConfigContainer, value: Any) -> None:
    """``precision_config``: a recipe name or object; ``None`` is Megatron-Bridge's default, BF16 mixed."""
    cfg.mixed_precision = "bf16_mixed" if value is None else value


def _set_pipeline_dtype(cfg: ConfigContainer, value: Any) -> None:
    """``pipeline_dtype``: the precision recipe's pipeline dtype (the owner of ``model.pipeline_dtype``)."""
    if value is None:
        return
    precision = dataclasses.replace(get_mixed_precision_config(cfg.mixed_precision))  # never the caller's object
    precision.pipeline_dtype = value
    cfg.mixed_precision = precision


def _set_comm_overlap(cfg: ConfigContainer, value: Any) -> None:
    """``comm_overlap_config``: a ``CommOverlapConfig``; ``None`` keeps the recipe's own."""
    if value is not None:
        cfg.comm_overlap = value


def _set_flex_backend(cfg: ConfigContainer, value: Any) -> None:
    """``moe_flex_dispatcher_backend``: the dispatcher fields of that backend (``None``: ``alltoall``)."""
    for name, field_value in dispatcher_fields(value).items():
        setattr(cfg.model, name, field_value)


def _set_seq_length(cfg: ConfigContainer, value: int) -> None:
    """``seq_length``: the model's sequence length, and the dataset's copy of it."""
    cfg.model.seq_length = value
    write_following_copies(cfg)


def _set_recompute(cfg: ConfigContainer, value: bool) -> None:
    """``enable_recompute=True``: full recompute of one layer at a time, uniformly (Megatron-Bridge's)."""
    if value:
        cfg.model.recompute_granularity = "full"
        cfg.model.recompute_method = "uniform"
        cfg.model.recompute_num_layers = 1


APPLIED: dict[str, Callable[[ConfigContainer, Any], None]] = {
    "tensor_model_parallel_size": _field_setter("model.tensor_model_parallel_size"),
    "pipeline_model_parallel_size": _field_setter("model.pipeline_model_parallel_size"),
    "virtual_pipeline_model_parallel_size": _field_setter("model.virtual_pipeline_model_parallel_size"),
    "context_parallel_size": _field_setter("model.context_parallel_size"),
    "expert_model_parallel_size": _field_setter("model.expert_model_parallel_size"),
    "expert_tensor_parallel_size": _field_setter("model.expert_tensor_parallel_size"),
    "sequence_parallel": _field_setter("model.sequence_parallel"),
    "account_for_embedding_in_pipeline_split": _field_setter("model.account_for_embedding_in_pipeline_split"),
    "account_for_loss_in_pipeline_split": _field_setter("model.account_for_loss_in_pipeline_split"),
    "enable_recompute": _set_recompute,
    "seq_length": _set_seq_length,
    "global_batch_size": _field_setter("train.global_batch_size"),
    "micro_batch_size": _field_setter("train.micro_batch_size"),
    "lr": _field_setter("optimizer.lr"),
    "min_lr": _field_setter("optimizer.min_lr"),
    "lr_warmup_iters": _field_setter("scheduler.lr_warmup_iters"),
    "lr_decay_iters": _field_setter("scheduler.lr_decay_iters"),
    "save_interval": _field_setter("checkpoint.save_interval"),
    "precision_config": _set_precision,
    "pipeline_dtype": _set_pipeline_dtype,
    "comm_overlap_config": _set_comm_overlap,
    "moe_flex_dispatcher_backend": _set_flex_backend,
}
"""Arguments that write the fields they stand for, applied in this order (precision before
``pipeline_dtype``, which edits the precision recipe)."""

COMBINED: tuple[str, ...] = ("train_iters", "mock", "data_paths", "dir", "name", "use_null_tokenizer", "hf_path")
"""Arguments applied together with others (run length with its schedule, data, run directory,
tokenizer)."""

_DATA_FIX = (
    "give data_paths (megatron's blend list: prefixes of .bin/.idx files, optionally "
    "weighted: ['0.3', '/data/a', '0.7', '/data/b']); dataset.split divides it into train/valid/test"
)

REFUSED: dict[str, tuple[str, str]] = {
    "data_args_path": ("a data-arguments file is not read here", _DATA_FIX),
    "per_split_data_args_path": ("per-split data files are not read here", _DATA_FIX),
    "train_data_path": ("per-split data paths are not read here", _DATA_FIX),
    "valid_data_path": ("per-split data paths are not read here", _DATA_FIX),
    "test_data_path": ("per-split data paths are not read here", _DATA_FIX),
    "use_megatron_fsdp": (
        "Megatron FSDP is not offered here",
        "leave it out: the recipes use megatron-core's distributed optimizer (optimizer.use_distributed_optimizer)",
    ),
    "eval_interval": (
        "this training loop runs no evaluation, so an interval would never be used",
        "leave it out; evaluate a saved checkpoint separately",
    ),
}
"""Arguments that cannot work here: the reason and what to do instead (each is accepted at its "off"
value, ``None`` or ``False``)."""

_BOOLEAN = frozenset(
    {
        "mock",
        "use_null_tokenizer",
        "sequence_parallel",
        "enable_recompute",
        "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split",
        "use_megatron_fsdp",
    }
)
"""Arguments that must be ``True`` or ``False``: a string such as ``"false"`` would read as true."""

ACCEPTED: tuple[str, ...] = tuple(APPLIED) + COMBINED + tuple(REFUSED)
"""Every keyword argument a recipe takes (Megatron-Bridge's names)."""


@dataclass(frozen=True)
class RecipeFacts:
    """What a recipe's arguments need to know about the recipe."""

    name: str
    hf_path: str | None
    """The Hugging Face model whose architecture the recipe builds (its tokenizer for
    ``use_null_tokenizer=False``); ``None`` for a model that has none (the tiny recipe)."""


def _argument(name: str, value: Any, message: str, fix: str) -> Violation:
    return Violation(f"recipe-argument-{name.replace('_', '-')}", (name,), (value,), message, fix, value_label="given")


def _refusal(name: str, value: Any, facts: RecipeFacts, given: Mapping[str, Any]) -> Violation | None:
    """Why ``name=value`` cannot be used with this recipe (and the other arguments), or ``None``."""
    if name not in ACCEPTED:
        fix = did_you_mean(name, ACCEPTED) or f"the recipe takes {', '.join(sorted(ACCEPTED))}"
        return _argument(name, value, f"{facts.name}() has no argument {name!r}", fix)
    if name in _BOOLEAN and not isinstance(value, bool):
        return _argument(name, value, f"{name} must be True or False", f"pass {name}=True or {name}=False")
    if name in REFUSED and value not in (None, False):
        return _argument(name, value, REFUSED[name][0], REFUSED[name][1])
    if name == "mock" and value and given.get("data_paths"):
        return _argument(
            name,
            value,
            "mock=True trains on mock data, so data_paths would not be used",
            "pass one of them: mock=True, or data_paths=[...]",
        )
    if name == "mock" and value is False and not given.get("data_paths"):
        return _argument(name, value, "mock=False needs data to train on", _DATA_FIX)
    if name == "hf_path" and value is not None and value != facts.hf_path:
        return _argument(
            name,
            value,
            f"{facts.name} builds the architecture of {facts.hf_path or 'its own model'}; "
            "no Hugging Face config is read here",
            "use the recipe of that model, or build a ConfigContainer with its model provider",
        )
    if name == "use_null_tokenizer" and value is False and facts.hf_path is None:
        return _argument(
            name,
            value,
            f"{facts.name} has no Hugging Face tokenizer",
            "leave use_null_tokenizer out (NullTokenizer, vocabulary model.vocab_size)",
        )
    return None


def _apply_run_length(cfg: ConfigContainer, given: Mapping[str, Any]) -> None:
    """``train_iters``, with the schedule the recipe writes for that length unless given too."""
    if "train_iters" not in given:
        return
    iters = given["train_iters"]
    cfg.train.train_iters = iters
    if "lr_decay_iters" not in given:
        cfg.scheduler.lr_decay_iters = iters
    if "lr_warmup_iters" not in given and isinstance(iters, int):
        cfg.scheduler.lr_warmup_iters = min(RECIPE_WARMUP_ITERS, iters // 10)


def _apply_data(cfg: ConfigContainer, given: Mapping[str, Any]) -> None:
    """``mock=True`` (mock data) or ``data_paths`` (indexed data)."""
    if given.get("mock"):
        cfg.dataset.data_paths = None
    if given.get("data_paths") is not None:
        cfg.dataset.data_paths = data_paths_from_alias(given["data_paths"])


def _apply_run_dir(cfg: ConfigContainer, given: Mapping[str, Any]) -> None:
    """``dir`` / ``name``: checkpoints in ``<dir>/<name>/checkpoints`` (resumed from there when that
    directory exists) and ``summary.json`` in ``<dir>/<name>``. TensorBoard stays as the recipe has it
    (off): it needs an optional package here, so ``logger.tensorboard_dir`` is the user's to set."""
    if given.get("dir") is None and given.get("name") is None:
        return
    base = given.get("dir") or os.path.join(os.getcwd(), DEFAULT_BASE_DIR)
    run_dir = os.path.join(base, given.get("name") or DEFAULT_RUN_NAME)
    checkpoints = os.path.join(run_dir, "checkpoints")
    cfg.checkpoint.save = checkpoints
    cfg.checkpoint.load = checkpoints if os.path.isdir(checkpoints) else None
    cfg.logger.log_dir = run_dir


def _apply_tokenizer(cfg: ConfigContainer, given: Mapping[str, Any], facts: RecipeFacts) -> None:
    """``use_null_tokenizer``: ``True`` the NullTokenizer, ``False`` the model's Hugging Face tokenizer."""
    if given.get("use_null_tokenizer") is True:
        cfg.tokenizer.tokenizer_type = "NullTokenizer"
        cfg.tokenizer.tokenizer_model = None
    elif given.get("use_null_tokenizer") is False:
        cfg.tokenizer.tokenizer_type = "HuggingFaceTokenizer"
        cfg.tokenizer.tokenizer_model = given.get("hf_path") or facts.hf_path


def check_recipe_arguments(facts: RecipeFacts, args: tuple[Any, ...], given: Mapping[str, Any]) -> None:
    """Refuse, in one :class:`ArgumentError`, every argument this recipe cannot take."""
    problems = [_refusal(name, value, facts, given) for name, value in given.items()]
    if args:
        problems.append(
            _argument(
                "positional",
                args,
                f"{facts.name}() takes keyword arguments only",
                f"name each argument: {facts.name}(train_iters=..., mock=True)",
            )
        )
    problems = [p for p in problems if p is not None]
    if problems:
        raise ArgumentError(problems, _TITLE)


def apply_recipe_arguments(cfg: ConfigContainer, facts: RecipeFacts, given: Mapping[str, Any]) -> ConfigContainer:
    """``cfg`` with every argument in ``given`` (already checked) written to its fields."""
    for name, apply in APPLIED.items():
        if name in given:
            apply(cfg, given[name])
    tp = given.get("tensor_model_parallel_size")
    if isinstance(tp, int) and "sequence_parallel" not in given:
        cfg.model.sequence_parallel = tp > 1  # as the recipes lay out TP
    _apply_run_length(cfg, given)
    _apply_data(cfg, given)
    _apply_run_dir(cfg, given)
    _apply_tokenizer(cfg, given, facts)
    return cfg


def takes_upstream_arguments(
    hf_path: str | None,
) -> Callable[[Callable[[], ConfigContainer]], Callable[..., ConfigContainer]]:
    """Give a recipe Megatron-Bridge's keyword arguments (see the module docstring); ``hf_path`` is the
    Hugging Face model the recipe builds, ``None`` for none."""

    def wrap(recipe: Callable[[], ConfigContainer]) -> Callable[..., ConfigContainer]:
        facts = RecipeFacts(recipe.__name__, hf_path)

        @functools.wraps(recipe)
        def build(*args: Any, **kwargs: Any) -> ConfigContainer:
            check_recipe_arguments(facts, args, kwargs)
            return apply_recipe_arguments(recipe(), facts, kwargs)

        build.upstream_hf_path = hf_path
        return build

    return wrap


__all__ = ["ACCEPTED", "APPLIED", "REFUSED", "takes_upstream_arguments"]
