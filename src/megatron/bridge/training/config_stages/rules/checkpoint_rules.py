"""Rules for ``checkpoint.load`` and ``checkpoint.save``, refused before launch: a directory that cannot
be resumed from (missing, not a checkpoint, damaged, incomplete), and a save directory that cannot be
written.

Each kind of unusable directory (see ``checkpoint_dir.inspect_checkpoint_dir``) is one rule; resuming
with another parallel layout or another model shape than the one that saved is refused too, showing
the saved and the current values. Everything is read from the directory as bounded JSON and names:
nothing there is unpickled or run before launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.config_stages.facts.checkpoint_dir import (
    LAYOUT_FILE,
    MODEL_KEY,
    TRACKER,
    CheckpointDir,
    inspect_checkpoint_dir,
    iteration_dir,
    model_shape,
    parallel_sizes,
)
from megatron.bridge.training.config_stages.facts.lock_holder import LOCK_NAME, held_by_another_live_run, lock_problem
from megatron.bridge.training.config_stages.facts.parallel_layout import known_data_parallel_size, layout_within
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext
from megatron.bridge.utils.owned_files import MAX_LISTED, unsafe_entries
from megatron.bridge.utils.paths import writable_directory_problem

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def _existing_dir(path: str | None) -> bool:
    return Path(path).is_dir() if path else False


def _given(cfg: ConfigContainer, which: str) -> str:
    """``checkpoint.<which>`` where a rule reads it: the rules that do apply only when it is set."""
    path = getattr(cfg.checkpoint, which)
    if not path:
        raise ValueError(f"checkpoint.{which} is unset: a rule that reads it applies only when it is set")
    return path


def _unsafe(path: str | None) -> list[str]:
    """Top-level entries of a checkpoint directory that are links or another user's (the run acts on
    names at the top only: the tracker, its lock, iteration and staging directories); at most a few."""
    found = unsafe_entries(path, recursive=False) if path and _existing_dir(path) else []
    return found[:MAX_LISTED] + ([f"... and {len(found) - MAX_LISTED} more"] if len(found) > MAX_LISTED else [])


def _saved_iterations(save: str) -> str | None:
    """What of another run ``save`` holds (its latest iteration, how many saved), ``None`` for nothing."""
    saved = sorted(p.name for p in Path(save).glob("iter_[0-9][0-9][0-9][0-9][0-9][0-9][0-9]") if p.is_dir())
    found = inspect_checkpoint_dir(save)
    if not saved and found.iteration is None:
        return None
    latest = f"latest iteration {found.iteration}" if found.iteration is not None else "no readable tracker"
    return f"{len(saved)} saved iteration(s) ({', '.join(saved[:3])}{', ...' if len(saved) > 3 else ''}), {latest}"


def _load_dir(cfg: ConfigContainer) -> CheckpointDir:
    return inspect_checkpoint_dir(_given(cfg, "load"))


def _same_dir(a: str | None, b: str | None) -> bool:
    return Path(a).resolve() == Path(b).resolve() if a and b else False


def _load_is(*kinds: str):
    return lambda cfg, ctx: bool(cfg.checkpoint.load) and _load_dir(cfg).kind in kinds


def _current_layout(cfg: ConfigContainer, ctx: RuleContext) -> dict[str, int | None]:
    return parallel_sizes(cfg, known_data_parallel_size(cfg, ctx))


def _saved_layout(cfg: ConfigContainer, ctx: RuleContext) -> dict | None:
    """The saved parallel sizes (the record less its model shape)."""
    layout = _load_dir(cfg).layout
    return None if layout is None else {k: v for k, v in layout.items() if k != MODEL_KEY}


def _shape_differences(cfg: ConfigContainer) -> dict[str, tuple[Any, Any]]:
    """Field -> (saved, current) for every recorded shape field whose value differs now."""
    saved, current = _load_dir(cfg).model or {}, model_shape(cfg)
    return {k: (saved[k], v) for k, v in current.items() if k in saved and saved[k] != v}


def _resuming_with_model_record(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return bool(cfg.checkpoint.load) and _load_dir(cfg).resumable and _load_dir(cfg).model is not None


def _resuming_without_model_record(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return bool(cfg.checkpoint.load) and _load_dir(cfg).resumable and _load_dir(cfg).model is None


def _layout_file(cfg: ConfigContainer, ctx: RuleContext) -> str:
    found = _load_dir(cfg)
    return str(found.path if found.iteration is None else iteration_dir(found.path, found.iteration) / LAYOUT_FILE)


def layout_matches_checkpoint(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Every recorded size equals the current one (DP only when the world size is known)."""
    saved, current = _saved_layout(cfg, ctx), _current_layout(cfg, ctx)
    if saved is None:  # no record to compare with (the rule applies only with one)
        return True
    return all(saved.get(k) == v for k, v in current.items() if v is not None and k in saved)


def _resuming_with_layout(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return (
        bool(cfg.checkpoint.load)
        and layout_within(cfg, ctx)
        and _load_dir(cfg).resumable
        and _saved_layout(cfg, ctx) is not None
    )


_LOAD_FIX = (
    "correct checkpoint.load, or unset it to train from scratch; for a first run that "
    "resumes later, point checkpoint.load and checkpoint.save at the same directory"
)


def _load_dir_rule(rule_id: str, kinds: tuple[str, ...], message: str, fix: str = _LOAD_FIX, **kw) -> Rule:
    """A ``checkpoint.load`` directory in one of ``kinds`` (see ``inspect_checkpoint_dir``) is refused."""
    return Rule(
        id=rule_id,
        fields=kw.pop("fields", ("checkpoint.load",)),
        applies=_load_is(*kinds),
        holds=kw.pop("holds", lambda cfg, ctx: False),
        message=message,
        fix=fix,
        group="checkpoint",
        **kw,
    )


def _holder(cfg: ConfigContainer, ctx: RuleContext) -> str:
    holder = held_by_another_live_run(_given(cfg, "save"))
    return holder.describe() if holder is not None else "no live run"


def _path_not_empty_rule(which: str) -> Rule:
    """``checkpoint.<which>`` given as an empty path is refused."""
    return Rule(
        id=f"checkpoint-{which}-path-not-empty",
        fields=(f"checkpoint.{which}",),
        applies=lambda cfg, ctx: isinstance(getattr(cfg.checkpoint, which), str),
        holds=lambda cfg, ctx: bool(getattr(cfg.checkpoint, which).strip()),
        message=f"checkpoint.{which} is an empty path (an unset shell variable?): it would mean no "
        f"checkpoint{' to resume from' if which == 'load' else 's'} without a word",
        fix=f"give checkpoint.{which} a directory, or leave it out (null) on purpose",
        group="checkpoint",
    )


def _entries_yours_rule(which: str) -> Rule:
    """A ``checkpoint.<which>`` directory holding links or other users' entries is refused."""
    return Rule(
        id=f"checkpoint-{which}-entries-yours",
        fields=(f"checkpoint.{which}",),
        applies=lambda cfg, ctx: _existing_dir(getattr(cfg.checkpoint, which)),
        holds=lambda cfg, ctx: not _unsafe(getattr(cfg.checkpoint, which)),
        message=f"checkpoint.{which} holds links or entries of another user: a run renames, replaces and "
        "removes names there (the tracker, iteration directories, leftovers of killed saves) and must never "
        "do so through a link or in someone else's files",
        fix="remove the listed entries (or ask their owner to), or choose a directory of your own",
        derived_values=(("entries", lambda cfg, ctx: _unsafe(getattr(cfg.checkpoint, which))),),
        group="checkpoint",
    )


CHECKPOINT_RULES: tuple[Rule, ...] = (
    _load_dir_rule(
        "checkpoint-load-exists",
        ("missing", "not_a_directory"),
        "checkpoint.load names no directory: a typo there would train from scratch without a word",
        _LOAD_FIX + " and create it first (mkdir -p)",
    ),
    _load_dir_rule(
        "checkpoint-load-empty-needs-save-there",
        ("empty",),
        "checkpoint.load is an empty directory and this run saves elsewhere, so nothing would ever be "
        "resumed from it (an empty directory is accepted as the start of an auto-resuming run: "
        "checkpoint.load == checkpoint.save)",
        fields=("checkpoint.load", "checkpoint.save"),
        holds=lambda cfg, ctx: _same_dir(cfg.checkpoint.load, cfg.checkpoint.save),
    ),
    _load_dir_rule(
        "checkpoint-load-is-iteration-dir",
        ("iteration_dir",),
        "checkpoint.load points at one saved iteration (iter_NNNNNNN), not at the checkpoint directory "
        "that holds latest_checkpointed_iteration.txt",
        "set checkpoint.load to the parent directory (the run's checkpoint.save)",
    ),
    _load_dir_rule(
        "checkpoint-load-has-tracker",
        ("no_tracker", "bad_tracker"),
        "checkpoint.load holds files but no readable latest_checkpointed_iteration.txt: it is not a "
        "checkpoint directory of this package",
        derived_values=(("tracker", lambda cfg, ctx: (list(_load_dir(cfg).problems) or [f"no {TRACKER}"])[0]),),
    ),
    _load_dir_rule(
        "checkpoint-load-tracker-names-saved-iteration",
        ("tracker_without_iteration",),
        "latest_checkpointed_iteration.txt names an iteration whose iter_NNNNNNN directory is missing "
        "(deleted or moved)",
        "restore that directory, or write the number of a saved iteration into the tracker file",
        derived_values=(("tracker_iteration", lambda cfg, ctx: _load_dir(cfg).iteration),),
    ),
    _load_dir_rule(
        "checkpoint-load-complete",
        ("incomplete",),
        "the latest checkpoint lacks files a resume needs (deleted, moved, or never written): without its "
        "layout record the layout check cannot run, without a rank's RNG state the run would not continue "
        "the saved one",
        "restore the files, or write the number of an earlier complete iteration into "
        "latest_checkpointed_iteration.txt",
        derived_values=(
            ("iteration", lambda cfg, ctx: _load_dir(cfg).iteration),
            ("missing", lambda cfg, ctx: list(_load_dir(cfg).missing)),
        ),
    ),
    _load_dir_rule(
        "checkpoint-layout-record-valid",
        ("bad_layout",),
        f"the latest checkpoint's {LAYOUT_FILE} is not a layout record this package writes (damaged or "
        "edited): a key is missing or not a size, or its sizes fit no run or not the files saved beside "
        "it; the layout and RNG checks cannot trust it",
        "restore the file from the run that wrote the checkpoint, or write the number of an earlier "
        f"complete iteration into {TRACKER}",
        derived_values=(
            ("layout_file", _layout_file),
            ("problems", lambda cfg, ctx: list(_load_dir(cfg).problems + _load_dir(cfg).missing)),
        ),
    ),
    Rule(
        id="checkpoint-save-writable",
        fields=("checkpoint.save",),
        applies=lambda cfg, ctx: bool(cfg.checkpoint.save),
        holds=lambda cfg, ctx: writable_directory_problem(Path(_given(cfg, "save"))) is None,
        message="checkpoint.save must be a directory this run can create and write; otherwise training runs "
        "and fails at its first save",
        fix="give checkpoint.save a writable directory (created if missing), or unset it",
        derived_values=(("problem", lambda cfg, ctx: writable_directory_problem(Path(_given(cfg, "save")))),),
        group="checkpoint",
    ),
    Rule(
        id="checkpoint-save-not-in-use",
        fields=("checkpoint.save",),
        applies=lambda cfg, ctx: bool(cfg.checkpoint.save),
        holds=lambda cfg, ctx: held_by_another_live_run(_given(cfg, "save")) is None,
        message="another run that is still alive saves into checkpoint.save; two runs in one directory would "
        "replace each other's checkpoints",
        fix=f"wait for that run, or give this run another checkpoint.save; if that run is gone, delete its {LOCK_NAME}",
        derived_values=(("held_by", _holder),),
        group="checkpoint",
    ),
    Rule(
        id="checkpoint-save-not-another-runs",
        fields=("checkpoint.save", "checkpoint.load"),
        applies=lambda cfg, ctx: (
            _existing_dir(cfg.checkpoint.save) and not _same_dir(cfg.checkpoint.load, cfg.checkpoint.save)
        ),
        holds=lambda cfg, ctx: _saved_iterations(_given(cfg, "save")) is None,
        message="checkpoint.save already holds the checkpoints of another run and this run does not resume from "
        "it: its saves would replace that run's iterations and move its latest_checkpointed_iteration.txt "
        "back to this run's",
        fix="resume from it (checkpoint.load = checkpoint.save), or choose another (new or empty) checkpoint.save",
        derived_values=(("holds", lambda cfg, ctx: _saved_iterations(_given(cfg, "save"))),),
        group="checkpoint",
    ),
    *(_path_not_empty_rule(which) for which in ("load", "save")),
    Rule(
        id="checkpoint-save-lock-usable",
        fields=("checkpoint.save",),
        applies=lambda cfg, ctx: bool(cfg.checkpoint.save),
        holds=lambda cfg, ctx: lock_problem(_given(cfg, "save")) is None,
        message=f"checkpoint.save's {LOCK_NAME} must be a plain file of yours: the run takes it as its lock at "
        "start, and anything else there would stop rank 0 after launch",
        fix=f"remove that {LOCK_NAME} (no run of this tool made it), or give this run another checkpoint.save",
        derived_values=(("problem", lambda cfg, ctx: lock_problem(_given(cfg, "save"))),),
        group="checkpoint",
    ),
    *(_entries_yours_rule(which) for which in ("save", "load")),
    Rule(
        id="resume-same-parallel-layout",
        fields=("checkpoint.load",),
        applies=_resuming_with_layout,
        holds=layout_matches_checkpoint,
        message="the checkpoint was written with another parallel layout; its optimizer state loads "
        "only into the layout that wrote it (resharding is not supported here)",
        fix="resume with the saved layout (same -tp/-pp/-vp/-cp/-ep/-et and GPU count), or start a "
        "new run without checkpoint.load",
        derived_values=(("saved_layout", _saved_layout), ("current_layout", _current_layout)),
        group="checkpoint",
    ),
    Rule(
        id="resume-same-model-shape",
        fields=("checkpoint.load",),
        applies=_resuming_with_model_record,
        holds=lambda cfg, ctx: not _shape_differences(cfg),
        message="the checkpoint holds another model: its weights do not have this config's shapes, so "
        "every rank would fail loading it",
        fix="set the model.* fields to the saved values shown (or resume with the config that wrote the "
        "checkpoint), or start a new run without checkpoint.load",
        derived_values=(
            ("saved_model", lambda cfg, ctx: {k: s for k, (s, _) in _shape_differences(cfg).items()}),
            ("current_model", lambda cfg, ctx: {k: c for k, (_, c) in _shape_differences(cfg).items()}),
        ),
        group="checkpoint",
    ),
    Rule(
        id="checkpoint-records-model-shape",
        fields=("checkpoint.load",),
        applies=_resuming_without_model_record,
        holds=lambda cfg, ctx: False,
        message=f"the checkpoint was written before {LAYOUT_FILE} recorded the model's shape: its shapes are "
        "not compared before launch (a checkpoint of another model would fail on every rank when it loads)",
        fix="nothing to do if the checkpoint is this model's; its next save records the shape",
        severity="warning",
        group="checkpoint",
    ),
)
