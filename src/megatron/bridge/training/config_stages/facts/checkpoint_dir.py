"""What a checkpoint directory holds, read from disk without torch or a process group.

The names written under ``checkpoint.save`` (one ``iter_NNNNNNN`` per saved iteration, the tracker
file, the layout record, the per-run staging directories) and :func:`inspect_checkpoint_dir`, which
tells validation before anything is launched whether a directory holds a complete checkpoint, is
empty, or is not a checkpoint directory. A fact the rules read, so it sits with the configuration's
facts; the loop's saves (``training/loop/checkpointing.py``) write what it names.

Everything here reads a directory someone else may have damaged or written on purpose, so every read
is bounded (the tracker and the layout record by size, the per-rank files by the layout's world size,
itself bounded) and nothing is unpickled: the layout record is JSON, and the dist-checkpoint files are
only looked for, never opened.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from megatron.bridge.training.config_stages.facts.lock_holder import LOCK_NAME
from megatron.bridge.training.config_stages.facts.parallel_layout import MAX_WORLD_SIZE

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

TRACKER = "latest_checkpointed_iteration.txt"
LAYOUT_FILE = "parallel_layout.json"
STAGING_SUFFIX = ".incomplete"
REPLACED_SUFFIX = ".replaced"


def iteration_dir(root: str | os.PathLike, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


MAX_TRACKER_DIGITS = 12
"""Digits an iteration number in the tracker may have (a trillion iterations: more than any run)."""

MAX_RECORD_BYTES = 64 * 1024
"""The largest layout record read (the real one is well under 2 KiB)."""

SHOWN_NAMES = 8
"""Missing per-rank files named in a message before the rest are counted."""


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: damaged files may hold anything, at any length."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def read_bounded(path: Path, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` (one more than ``limit`` says it is
    longer). Opened without blocking and checked to be a regular file, so a FIFO or a device planted
    at the name is refused instead of hanging or reading forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return handle.read(limit + 1)


def read_tracker(root: str | os.PathLike) -> tuple[int | None, str | None]:
    """``(iteration, None)`` from ``root``'s tracker, or ``(None, what is wrong with it)``.

    At most a few bytes are read (a tracker of any size is a problem, never a memory or ``int()``
    limit error), as bytes (garbage is "not a number", never a decode error).
    """
    limit = MAX_TRACKER_DIGITS + 64  # room for whitespace around the digits
    try:
        head = read_bounded(Path(root) / TRACKER, limit)
    except OSError as exc:
        return None, f"{TRACKER} cannot be read ({exc.strerror or exc})"
    text = head.strip()
    if len(head) > limit or len(text) > MAX_TRACKER_DIGITS:
        return None, (
            f"{TRACKER} holds more than {MAX_TRACKER_DIGITS} characters: not an iteration number "
            f"(at most {MAX_TRACKER_DIGITS} digits)"
        )
    if not re.fullmatch(rb"[0-9]+", text):
        return None, f"{TRACKER} holds {_short(text)}: not an iteration number (ASCII digits only)"
    return int(text), None


def latest_iteration(root: str | os.PathLike | None) -> int | None:
    """The last completely saved iteration under ``root``, or ``None`` (no tracker, or a damaged one)."""
    if not root or not (Path(root) / TRACKER).is_file():
        return None
    return read_tracker(root)[0]


CheckpointDirKind = Literal[
    "missing",
    "not_a_directory",
    "empty",
    "checkpoint",
    "bad_tracker",
    "tracker_without_iteration",
    "iteration_dir",
    "no_tracker",
    "incomplete",
    "bad_layout",
]


@dataclass(frozen=True)
class CheckpointDir:
    """What a ``checkpoint.load`` directory holds, read without torch.distributed."""

    path: Path
    kind: CheckpointDirKind
    iteration: int | None = None
    layout: dict[str, Any] | None = None
    """The parallel layout recorded with the latest checkpoint (``None`` when not recorded)."""
    missing: tuple[str, ...] = ()
    """Files of the latest checkpoint a resume needs that are absent or unreadable (``incomplete``;
    at most :data:`SHOWN_NAMES` per-rank names, then a count)."""
    problems: tuple[str, ...] = ()
    """What is wrong with the tracker (``bad_tracker``) or the layout record (``bad_layout``)."""

    @property
    def resumable(self) -> bool:
        return self.kind == "checkpoint"

    @property
    def model(self) -> dict[str, Any] | None:
        """The model shape the latest checkpoint recorded (``None``: written before it was recorded)."""
        model = (self.layout or {}).get(MODEL_KEY)
        return model if isinstance(model, dict) else None


def _looks_like_iteration_dir(path: Path) -> bool:
    """Named like one saved iteration, or holding what dist_checkpointing writes into one."""
    return bool(re.fullmatch(r"iter_\d{7}", path.name)) or any(
        (path / name).is_file() for name in ("metadata.json", "common.pt")
    )


def _leftover(child: Path) -> bool:
    """What a save killed before publishing its first checkpoint leaves behind (and the lock of a run
    that is gone: a live one is refused by its own rule)."""
    if child.is_symlink():
        return False  # never harmless: refused by the entries rule
    tracker_tmp = child.name.startswith(f".{TRACKER}.") and child.name.endswith(".tmp")  # owned_files.replace_file
    return STAGING_SUFFIX in child.name or tracker_tmp or child.name == LOCK_NAME


def staging_dir(final: Path, run_id: str) -> Path:
    """Where one run writes a save of ``final`` before publishing it: named for the run, so a save can
    never write into, or remove, another run's staging directory."""
    return final.with_name(f"{final.name}{STAGING_SUFFIX}.{run_id}")


def staged_iterations(root: str | os.PathLike) -> list[int]:
    """Iterations whose save is staged in ``root`` and not published: being written, or killed."""
    found = (
        re.fullmatch(rf"iter_(\d+){re.escape(STAGING_SUFFIX)}\..*", child.name)
        for child in Path(root).glob(f"iter_*{STAGING_SUFFIX}*")
    )
    return sorted(int(match.group(1)) for match in found if match)


def _read_record(path: Path) -> tuple[Any, str | None]:
    """``(parsed JSON, None)`` of ``path``'s layout record, or ``(None, why it is not one)``; reads at
    most :data:`MAX_RECORD_BYTES`."""
    try:
        data = read_bounded(path / LAYOUT_FILE, MAX_RECORD_BYTES)
    except OSError as exc:
        return None, f"{LAYOUT_FILE} cannot be read ({exc.strerror or exc})"
    if len(data) > MAX_RECORD_BYTES:
        return None, f"{LAYOUT_FILE} is larger than {MAX_RECORD_BYTES // 1024} KiB: not a layout record"
    try:
        return json.loads(data), None
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, bad UTF-8, a 5000-digit number
        return None, f"{LAYOUT_FILE} is not JSON ({_short(str(exc), 80)})"


COMMON_FILES = ("metadata.json", ".metadata")
"""What megatron-core's ``torch_dist`` writer puts into every saved iteration besides the shards."""

LAYOUT_SIZES = ("tp", "pp", "cp", "ep", "etp", "dp")
"""Keys of the layout record that are positive integers (``vpp`` is one too, or null)."""

MODEL_KEY = "model"
"""The layout record's entry holding the model's shape (:func:`model_shape`)."""


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _size_problems(layout: dict[str, Any]) -> list[str]:
    """Keys of the record that are missing or not sizes."""
    problems = [f"{key} is missing" for key in (*LAYOUT_SIZES, "vpp") if key not in layout]
    problems += [
        f"{key}={_short(layout[key])} is not a positive integer"
        for key in LAYOUT_SIZES
        if key in layout and not _positive_int(layout[key])
    ]
    if "vpp" in layout and layout["vpp"] is not None and not _positive_int(layout["vpp"]):
        problems.append(f"vpp={_short(layout['vpp'])} is neither null nor a positive integer")
    if MODEL_KEY in layout and not isinstance(layout[MODEL_KEY], dict):
        problems.append(f"{MODEL_KEY}={_short(layout[MODEL_KEY])} is not a JSON object")
    return problems


def saved_world_size(layout: dict[str, Any]) -> int:
    """Ranks of the run that wrote a (checked) layout record: TP x PP x CP x DP."""
    return layout["tp"] * layout["pp"] * layout["cp"] * layout["dp"]


def layout_problems(layout: Any) -> list[str]:
    """Why ``layout`` is not a record this package writes (empty when it is one): missing keys, sizes
    that are not positive integers, and sizes no run can have (more ranks than
    :data:`MAX_WORLD_SIZE`, an expert span that does not divide the world size). The RNG check
    enumerates the ranks the record names, so a record is checked before it is trusted with that."""
    if not isinstance(layout, dict):
        return [f"{LAYOUT_FILE} holds {_short(layout)}, not a JSON object"]
    problems = _size_problems(layout)
    if problems:
        return problems
    world = saved_world_size(layout)
    if world > MAX_WORLD_SIZE:
        return [f"tp*pp*cp*dp = {world} ranks, more than any run has (at most {MAX_WORLD_SIZE})"]
    span = layout["ep"] * layout["etp"] * layout["pp"]
    if world % span:
        return [f"ep*etp*pp = {span} does not divide the {world} ranks of tp*pp*cp*dp: no run has this layout"]
    return []


def _rank_files(iteration: Path) -> dict[int, str]:
    """Rank -> name of every per-rank RNG file present in ``iteration/rng``."""
    try:
        entries = list(os.scandir(iteration / "rng"))
    except OSError:
        return {}
    found = {}
    for entry in entries:
        match = re.fullmatch(r"rank_(\d{5,9})\.pt", entry.name)
        if match and entry.is_file():
            found[int(match.group(1))] = entry.name
    return found


def _rng_problems(iteration: Path, world: int) -> tuple[list[str], list[str]]:
    """``(missing RNG files, layout problems)`` of a checked record with ``world`` ranks: a rank's file
    that is absent, and a file of a rank the record does not have (the record does not match the
    files saved beside it)."""
    present = _rank_files(iteration)
    absent = [f"rng/rank_{rank:05d}.pt" for rank in range(world) if rank not in present]
    if len(absent) > SHOWN_NAMES:
        absent = absent[:SHOWN_NAMES] + [f"... and {len(absent) - SHOWN_NAMES} more of {world} ranks' RNG files"]
    extra = sorted(rank for rank in present if rank >= world)
    mismatch = (
        [
            f"it names {world} ranks (tp*pp*cp*dp) but rng/ holds {present[extra[0]]}: the record does not "
            f"match the files saved with it"
        ]
        if extra
        else []
    )
    return absent, mismatch


def _check_iteration(iteration: Path) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """``(layout record, missing files, layout problems)`` of one saved iteration: the common files,
    the layout record (without it the layout check could not run) and every rank's RNG state."""
    missing = [name for name in COMMON_FILES if not (iteration / name).is_file()]
    if not os.path.lexists(iteration / LAYOUT_FILE):
        return None, missing + [f"{LAYOUT_FILE} (absent)"], []
    layout, unreadable = _read_record(iteration)
    problems = [unreadable] if unreadable else layout_problems(layout)
    if problems:
        return None, missing, problems
    absent, mismatch = _rng_problems(iteration, saved_world_size(layout))
    return layout, missing + absent, mismatch


def missing_files(iteration: Path) -> tuple[str, ...]:
    """What a resume needs from one saved iteration and does not find (see :func:`_check_iteration`)."""
    _, missing, _ = _check_iteration(iteration)
    return tuple(missing)


def inspect_checkpoint_dir(root: str | os.PathLike) -> CheckpointDir:
    """Classify ``root`` as a resume source (no process group, no torch I/O)."""
    path = Path(root)
    if not path.exists():
        return CheckpointDir(path, "missing")
    if not path.is_dir():
        return CheckpointDir(path, "not_a_directory")
    tracker = path / TRACKER
    if tracker.is_file():
        iteration, problem = read_tracker(path)
        if iteration is None:
            return CheckpointDir(path, "bad_tracker", problems=(problem or "unreadable tracker",))
        saved = iteration_dir(path, iteration)
        if not saved.is_dir():
            return CheckpointDir(path, "tracker_without_iteration", iteration)
        layout, missing, problems = _check_iteration(saved)
        if problems:
            return CheckpointDir(path, "bad_layout", iteration, None, tuple(missing), tuple(problems))
        if missing:
            return CheckpointDir(path, "incomplete", iteration, layout, tuple(missing))
        return CheckpointDir(path, "checkpoint", iteration, layout)
    if _looks_like_iteration_dir(path):
        return CheckpointDir(path, "iteration_dir")
    if all(_leftover(child) for child in path.iterdir()):
        return CheckpointDir(path, "empty")
    return CheckpointDir(path, "no_tracker")


SHAPE_FIELDS: tuple[str, ...] = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "num_moe_experts",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_shared_expert_gate",
    "moe_layer_freq",
    "moe_router_enable_expert_bias",
    "vocab_size",
    "make_vocab_size_divisible_by",
    "gated_linear_unit",
    "add_bias_linear",
    "add_qkv_bias",
    "qk_layernorm",
    "normalization",
    "share_embeddings_and_output_weights",
    "position_embedding_type",
    "mtp_num_layers",
)
"""``model.*`` fields that decide which weights the model has and their shapes (with the parallel
sizes, which the layout record holds beside them)."""


def _json_value(value: Any) -> Any:
    """``value`` as JSON holds it (numbers, strings, booleans, null, lists); anything else as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return str(value)


def model_shape(cfg: ConfigContainer) -> dict[str, Any]:
    """The model's shape-deciding fields, with megatron-core's defaults for those left unset (so the
    shape of a config before megatron-core's ``__post_init__`` equals the shape after it).

    Recorded with every checkpoint and compared before launch: a checkpoint of another model shape
    would otherwise be accepted and then fail on every rank with a shape-mismatch traceback.
    """
    m = cfg.model
    shape = {name: _json_value(getattr(m, name, None)) for name in SHAPE_FIELDS}
    hidden, heads = shape["hidden_size"], shape["num_attention_heads"]
    if _positive_int(hidden) and shape["ffn_hidden_size"] is None:
        shape["ffn_hidden_size"] = 4 * hidden
    if _positive_int(hidden) and _positive_int(heads):
        shape["kv_channels"] = shape["kv_channels"] if shape["kv_channels"] is not None else hidden // heads
        shape["num_query_groups"] = shape["num_query_groups"] if shape["num_query_groups"] is not None else heads
    if shape["num_moe_experts"] is not None and shape["moe_ffn_hidden_size"] is None:
        shape["moe_ffn_hidden_size"] = shape["ffn_hidden_size"]
    return shape


def parallel_sizes(cfg: ConfigContainer, data_parallel_size: int | None) -> dict[str, int | None]:
    """The parallel sizes that decide how model and optimizer state are sharded on disk.

    Compared on resume: this package's optimizer format is only loaded back under the layout that
    wrote it (resharding is not supported here).
    """
    m = cfg.model
    return dict(
        tp=m.tensor_model_parallel_size,
        pp=m.pipeline_model_parallel_size,
        vpp=m.virtual_pipeline_model_parallel_size,
        cp=m.context_parallel_size,
        ep=m.expert_model_parallel_size,
        etp=m.expert_tensor_parallel_size or m.tensor_model_parallel_size,
        dp=data_parallel_size,
    )


def checkpoint_layout(cfg: ConfigContainer, data_parallel_size: int | None) -> dict[str, Any]:
    """The layout record saved with every checkpoint (``parallel_layout.json``): the parallel sizes
    (:func:`parallel_sizes`) and, under ``model``, the model's shape (:func:`model_shape`). Both are
    compared before a resume is launched."""
    return {**parallel_sizes(cfg, data_parallel_size), MODEL_KEY: model_shape(cfg)}
