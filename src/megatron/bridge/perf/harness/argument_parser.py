"""Command-line flags of the performance harness (Megatron-Bridge's familiar names, without sentinels).

Conventions that differ from Megatron-Bridge's harness on purpose:

* "not given" is always ``None``; no ``-1`` or ``"None"`` placeholders reach the config layer;
* boolean flags take an explicit value (``true/false/1/0/yes/no``, any case) and reject anything else,
  so ``--moe_a2a_overlap false`` is a real ``False``;
* ``--moe_flex_dispatcher_backend None`` is parsed to :data:`PLAIN_ALLTOALL`: an explicit request for
  megatron-core's plain ``alltoall`` dispatcher, distinct from not giving the flag;
* every positional ``key=value`` is a dotted override, applied last.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import NoReturn

from megatron.bridge.emulation.network import PRESETS as NETWORK_PRESETS
from megatron.bridge.perf.harness.dispatch_names import flex_backend_names
from megatron.bridge.perf.harness.harness_args import FLAG_FIELDS, HarnessArgs
from megatron.bridge.perf.harness.recipe_lookup import recipe_tasks
from megatron.bridge.training.harness_surface import GPU_TYPES, MAX_WORLD_SIZE, did_you_mean

PLAIN_ALLTOALL = "alltoall"
"""Parsed value of ``--moe_flex_dispatcher_backend None``: plain alltoall, no flex backend."""

GPU_CHOICES = (*GPU_TYPES, "cpu")
"""Target GPU types accepted by ``-g`` (``cpu`` selects the CPU smoke mode)."""

COMPUTE_DTYPES: dict[str, str] = {
    "bf16": "bf16_mixed",
    "fp16": "fp16_mixed",
    "fp8": "bf16_with_fp8_current_scaling_mixed",
    "fp8_cs": "bf16_with_fp8_current_scaling_mixed",
    "fp8_ds": "bf16_with_fp8_delayed_scaling_mixed",
    "fp8_mx": "bf16_with_mxfp8_mixed",
}
"""``-c`` value -> ``cfg.mixed_precision`` recipe name."""

FINE_TUNING_TASKS = ("sft", "peft")
"""Megatron-Bridge's fine-tuning tasks: no recipe here is written for them (refused by name)."""
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
TOKENIZER_TYPES = ("NullTokenizer", "HuggingFaceTokenizer")

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
TOP_LEVEL_KEYS = ("mixed_precision",)
"""Settings at the top of the config tree rather than in a section (``mixed_precision=bf16_mixed``)."""
_OVERRIDE = re.compile(
    r"^((\+\+|\+)?([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+|" + "|".join(TOP_LEVEL_KEYS) + r")=.*"
    r"|~[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+(=.*)?)$",
    re.S,
)
"""A dotted override (or one of :data:`TOP_LEVEL_KEYS`), in Hydra's forms too: ``key=v``, ``+key=v``,
``++key=v``, ``~key``."""


def str_to_bool(text: str) -> bool:
    """``true/false/1/0/yes/no`` (any case) -> bool; anything else is a usage error."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true/false/1/0/yes/no, got {text!r}")


def flex_backend(text: str) -> str:
    """A flex dispatch path's name (``deepep``, ...) selects flex dispatch; ``None``/``alltoall`` mean
    plain alltoall."""
    value = text.strip().lower()
    if value in ("none", PLAIN_ALLTOALL):
        return PLAIN_ALLTOALL
    names = flex_backend_names()
    if value in names:
        return value
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)} or None (plain alltoall), got {text!r}")


def positive_int(text: str) -> int:
    """An integer >= 1 (parallel sizes, GPU counts, steps)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def gpu_count(text: str) -> int:
    """``-ng``: a positive integer up to ``MAX_WORLD_SIZE`` (a larger count is a typo; the harness's
    GPU-count arithmetic and messages are bounded by it)."""
    value = positive_int(text)
    if value > MAX_WORLD_SIZE:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_WORLD_SIZE} GPUs (more than any training job has: a typo?), got {text!r}"
        )
    return value


def int_list(text: str) -> list[int]:
    """Comma-separated non-negative integers, e.g. ``0,1``."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def path_text(text: str) -> str:
    """A path that names something: an empty or blank value (``-l "$UNSET"``) would mean the
    current directory, whose files a run would then replace."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r} (an unset shell variable?)")
    return text


def window(text: str) -> list[int]:
    """Two 1-based iterations ``FIRST,LAST`` with ``FIRST <= LAST``."""
    values = int_list(text)
    if len(values) != 2 or not 1 <= values[0] <= values[1]:
        raise argparse.ArgumentTypeError(f"expected FIRST,LAST with 1 <= FIRST <= LAST, got {text!r}")
    return values


def task_choice(tasks: Sequence[str]):
    """``--task``: one of the tasks a recipe is written for (``recipe_lookup.recipe_tasks``); any
    other (Megatron-Bridge's ``sft``, ``peft``) is refused with what exists."""

    def parse(text: str) -> str:
        task = text.strip().lower()
        if task in tasks:
            return task
        offered = ", ".join(f"--task {t}" for t in tasks)
        why = " (fine-tuning, Megatron-Bridge's sft and peft, is not offered)" if task in FINE_TUNING_TASKS else ""
        raise argparse.ArgumentTypeError(f"no recipe is written for --task {text}: the recipes are for {offered}{why}")

    parse.__name__ = "task"
    return parse


def _choice(options: Sequence[str], *, lower: bool = True):
    """Case-insensitive choice that returns the canonical spelling."""
    canon = {(o.lower() if lower else o): o for o in options}

    def parse(text: str) -> str:
        key = text.strip().lower() if lower else text.strip()
        if key not in canon:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(options)}, got {text!r}")
        return canon[key]

    parse.__name__ = "choice"
    return parse


HELP_EPILOG = """\
checkpoint and resume:
  checkpoint.save=DIR checkpoint.load=DIR [checkpoint.save_interval=N]
      save into DIR (every N iterations and at the end) and resume from it: run the same command
      again to continue. checkpoint.load must exist (mkdir -p DIR before the first run); an empty
      DIR starts from iteration 0.
stopping:
  SIGTERM or Ctrl-C: the ranks finish the current step, save once (with checkpoint.save) and exit;
  the harness prints where it stopped and exits 128+signal. A later second signal kills the job.
  Batch scripts ask SLURM for SIGTERM 120 s before the time limit and do the same.
exit codes: 0 ok, 2 refused input (nothing launched), 3 machine cannot run it, 128+N stopped by
  signal N, else the job's own code.
"""


LOG_DIR_DEFAULT = "runs/<-mr>_<--task>[_<N>gpu]_<YYYYmmdd_HHMMSS>_<token>"
"""The run directory when ``-l`` is not given (``training.metrics.default_log_dir``: the recipe
function's name without ``_config``, then the time and a random token, so that every run gets its
own), e.g. ``runs/qwen3_moe_tiny_pretrain_20250101_120000_3fa9c1``."""
SWEEP_DIR_DEFAULT = "runs/<-mr>_<--task>_sweep_<YYYYmmdd_HHMMSS>_<token>"
"""The sweep's directory when ``-l`` is not given (``sweep_runs.sweep_root``)."""

SHORT_USAGE = "usage: run_script.py -mr RECIPE [-g GPU] [-ng N] [flags ...] [key=value ...]"
"""The one usage line an input error prints (``-h`` prints every flag)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's default shown once: from its help text when that names it, else ``(default: X)``
    for a flag with a real default (``None`` means "not given" and is not shown); the epilog keeps
    its line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS) or action.nargs == "*":
            return text
        return f"{text} (default: {default})" if text else f"(default: {default})"

    def _split_lines(self, text: str, width: int) -> list[str]:
        """Wrapped at spaces only: a path pattern such as ``runs/<-mr>_<--task>`` stays whole."""
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)


class _Parser(argparse.ArgumentParser):
    """An input error prints its message, one usage line and where the full help is (not the
    whole usage block); exit code 2 as argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n{SHORT_USAGE}\n{self.prog} -h lists every flag\n")


def unknown_flags_message(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str | None:
    """The unknown flags among ``extras``, each with the flag it is probably meant to be."""
    flags = [t for t in extras if t.startswith("-") and not _is_number(t)]
    if not flags:
        return None
    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    parts = []
    for token in flags:
        name = token.split("=", 1)[0]
        spelt = "--" + name.lstrip("-").replace("-", "_")
        near = spelt if spelt in options else _nearly(spelt, options)
        hint = f"did you mean {near}?" if near else did_you_mean(spelt, options)
        parts.append(f"{name} ({hint})" if hint else name)
    return f"unrecognized argument{'s' if len(parts) > 1 else ''}: {', '.join(parts)}"


def _nearly(name: str, options: Sequence[str]) -> str | None:
    """The one option ``name`` differs from by a letter or so (``--max_step``: ``--max_steps``), if any:
    then it alone is suggested, not every option that shares a few letters with it."""
    best = difflib.get_close_matches(name, options, n=1, cutoff=0.9)
    return best[0] if best else None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    """The harness parser; every default is ``None`` unless the flag is a plain switch."""
    p = _Parser(
        prog="run_script.py",
        description="Megatron-Bridge-style performance harness for MoE EP-overlap runs. "
        "Precedence: recipe < --config_file < flags < dotted overrides (key=value).",
        formatter_class=_HelpFormatter,
        epilog=HELP_EPILOG,
    )
    run = p.add_argument_group("recipe and machine")
    run.add_argument(
        "-m", "--model_family_name", default="qwen", help="recipe family (package under megatron.bridge.recipes)"
    )
    run.add_argument("-mr", "--model_recipe_name", required=True, help="recipe name, e.g. qwen3_30b_a3b")
    tasks = recipe_tasks()
    run.add_argument(
        "--task",
        type=task_choice(tasks),
        default="pretrain",
        help=f"{'|'.join(tasks)}: what the recipe is written for (no recipe here fine-tunes)",
    )
    run.add_argument(
        "-g",
        "--gpu",
        type=_choice(GPU_CHOICES),
        default=None,
        help="target GPU type for validation (and flex backend support); cpu = CPU smoke mode",
    )
    run.add_argument(
        "-c",
        "--compute_dtype",
        type=_choice(tuple(COMPUTE_DTYPES)),
        default=None,
        help="compute precision; fp8 variants need Transformer Engine",
    )
    run.add_argument(
        "-ng",
        "--num_gpus",
        type=gpu_count,
        default=None,
        help="total GPUs (processes in CPU mode) (default: the recipe's reference GPU count)",
    )
    run.add_argument(
        "-gn", "--gpus_per_node", type=positive_int, default=None, help="GPUs per node (default: -ng, at most 8)"
    )
    run.add_argument(
        "--procs_per_gpu",
        type=positive_int,
        default=1,
        help="ranks sharing one GPU (>1 needs the gloo backend; NCCL refuses it)",
    )

    model = p.add_argument_group("training and model (each maps to one config field)")
    model.add_argument("--max_steps", type=positive_int, default=None, help=FLAG_FIELDS["max_steps"])
    model.add_argument(
        "--cuda_graph_impl", type=_choice(CUDA_GRAPH_IMPLS), default=None, help=FLAG_FIELDS["cuda_graph_impl"]
    )
    model.add_argument(
        "--moe_flex_dispatcher_backend",
        type=flex_backend,
        default=None,
        help=f"{'|'.join(flex_backend_names())}: model.moe_token_dispatcher_type=flex with that "
        "model.moe_flex_dispatcher_backend (and model.moe_shared_expert_overlap=false); "
        "None: model.moe_token_dispatcher_type=alltoall, no backend",
    )
    model.add_argument(
        "--moe_a2a_overlap",
        type=str_to_bool,
        default=None,
        help="comm_overlap.overlap_moe_expert_parallel_comm (EP overlap on/off); delayed "
        "wgrad stays comm_overlap.delay_wgrad_compute, and on without EP overlap is refused",
    )
    model.add_argument(
        "--tokenizer_type", type=_choice(TOKENIZER_TYPES, lower=False), default=None, help=FLAG_FIELDS["tokenizer_type"]
    )
    for short, dest in (
        ("-tp", "tensor_model_parallel_size"),
        ("-pp", "pipeline_model_parallel_size"),
        ("-vp", "virtual_pipeline_model_parallel_size"),
        ("-cp", "context_parallel_size"),
        ("-ep", "expert_model_parallel_size"),
        ("-et", "expert_tensor_parallel_size"),
        ("-gb", "global_batch_size"),
        ("-mb", "micro_batch_size"),
        ("-sl", "seq_length"),
    ):
        model.add_argument(short, f"--{dest}", type=positive_int, default=None, help=FLAG_FIELDS[dest])

    io = p.add_argument_group("inputs, outputs and modes")
    io.add_argument("--config_file", default=None, help="YAML applied over the recipe")
    io.add_argument("--dryrun", action="store_true", help="resolve, validate, report; launch nothing")
    io.add_argument("--save_config_filepath", type=path_text, default=None, help="write the resolved config YAML here")
    io.add_argument(
        "-l",
        "--log_dir",
        type=path_text,
        default=None,
        help=f"run directory (default: {LOG_DIR_DEFAULT}; a sweep: {SWEEP_DIR_DEFAULT})",
    )
    io.add_argument(
        "--steady_state_window",
        type=window,
        default=None,
        help="FIRST,LAST steps of the steady-state mean (default: automatic, the steps after the first max(2, 10 %%))",
    )
    io.add_argument(
        "--sweep",
        default=None,
        metavar="KEY=V1,V2,...",
        help="one-knob A/B sweep: each value of one dotted key runs as its own job",
    )
    io.add_argument(
        "--sweep_repeats",
        type=positive_int,
        default=1,
        metavar="N",
        help="run the sweep's values in N interleaved rounds (v1, v2, v1, v2, ...); sweep.md shows "
        "each round's mean and their spread",
    )
    io.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="before launching, print the full overlap report and every overlap-related value "
        "with its source (--dryrun always does); on the console, also the ranks' third-party "
        "warnings and megatron-core's INFO logs (<log_dir>/launch.log holds all of the launcher's "
        "and the ranks' output either way)",
    )

    emu = p.add_argument_group(
        "emulated world (one process trains one rank of the -ng layout; communication times are modeled, not measured)"
    )
    emu.add_argument(
        "--emulate",
        action="store_true",
        help="validate the -ng/-gn layout as for a real run, then train its rank --emulate_rank in one "
        "process; every collective takes the time --network gives it",
    )
    emu.add_argument(
        "--network",
        type=_choice(tuple(NETWORK_PRESETS)),
        default=None,
        help=f"network model of the emulated world: {'|'.join(NETWORK_PRESETS)} (default: h100_ib400); "
        "figures can be overridden with emulation.* overrides",
    )
    emu.add_argument("--emulate_rank", type=int, default=None, help="the rank the process plays (default: 0)")

    prof = p.add_argument_group("profiling")
    prof.add_argument("--profile", action="store_true", help="capture a torch profiler trace")
    prof.add_argument("--profile_step_start", type=positive_int, default=None)
    prof.add_argument("--profile_step_end", type=positive_int, default=None)
    prof.add_argument("--profile_ranks", type=int_list, default=None, help="e.g. 0,1")

    slurm = p.add_argument_group("SLURM (multi-node outside an allocation writes an sbatch script)")
    slurm.add_argument("--account", default=None)
    slurm.add_argument("--partition", default=None)
    slurm.add_argument("--time", dest="time_limit", default=None, help="e.g. 00:30:00")

    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, applied last")
    return p


def parse_args(argv: Sequence[str] | None = None) -> HarnessArgs:
    """Parse ``argv`` (default: ``sys.argv[1:]``) into the typed record; positional ``key=value`` may
    appear anywhere. Exits 2 on bad input."""
    parser = build_parser()
    args, extras = parser.parse_known_intermixed_args(argv)
    unknown = unknown_flags_message(parser, extras)
    if unknown:
        parser.error(unknown)
    if extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    bad = [o for o in args.overrides if not _OVERRIDE.match(o)]
    if bad:
        parser.error(f"dotted overrides look like section.field=value (or mixed_precision=NAME); got {bad}")
    if args.sweep is not None and not _OVERRIDE.match(args.sweep):
        parser.error(f"--sweep expects dotted.key=v1,v2,...; got {args.sweep!r}")
    if args.sweep_repeats > 1 and args.sweep is None:
        parser.error("--sweep_repeats repeats a sweep; give --sweep dotted.key=v1,v2,... too")
    if args.profile_step_start and args.profile_step_end and args.profile_step_start > args.profile_step_end:
        parser.error("--profile_step_start must be <= --profile_step_end")
    if args.gpu == "cpu" and args.procs_per_gpu != 1:
        parser.error("--procs_per_gpu applies to GPUs; in CPU mode -ng is the process count")
    emulation_only = [
        flag
        for flag, dest in (("--network", "network"), ("--emulate_rank", "emulate_rank"))
        if getattr(args, dest) is not None
    ]
    if emulation_only and not args.emulate:  # a real run has no network model and plays no rank
        parser.error(
            f"{', '.join(emulation_only)} without --emulate would have no effect: a run without --emulate "
            "is a real one; add --emulate to play the -ng layout in one process, or leave "
            f"{' and '.join(emulation_only)} out"
        )
    return HarnessArgs.from_namespace(args, sys.argv[1:] if argv is None else argv)
