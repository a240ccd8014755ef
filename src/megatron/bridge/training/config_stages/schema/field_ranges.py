"""Allowed ranges of numeric settings: one table, turned into rules, docs rows and test cases.

A value outside its range would otherwise pass validation and fail much later, inside a rank
(``model.seq_length=-1`` ends in ``std::bad_array_new_length`` while building the model) or train
something meaningless (``optimizer.lr=-1``). Each row says what the bound protects; the validator
reports every violated row at once, before anything is launched.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.config_stages.schema.rule_base import RANGE_PREFIX, Rule, RuleContext, read_field

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


@dataclass(frozen=True)
class FieldRange:
    """``low <= value <= high`` (``<`` where the bound is exclusive); ``None`` allowed if optional."""

    field: str
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True
    optional: bool = False
    why: str = ""
    integer: bool = False
    """A count or a size: a whole number (``2.0``, ``1e30`` or ``"2"`` are refused)."""

    @property
    def rule_id(self) -> str:
        return f"{RANGE_PREFIX}{self.field}"

    def describe(self) -> str:
        """``>= 1``, ``> 0``, ``in [0, 1)``."""
        if self.low is not None and self.high is not None:
            left, right = "[" if self.low_inclusive else "(", "]" if self.high_inclusive else ")"
            return f"in {left}{_num(self.low)}, {_num(self.high)}{right}"
        if self.low is not None:
            return f"{'>=' if self.low_inclusive else '>'} {_num(self.low)}"
        return f"{'<=' if self.high_inclusive else '<'} {_num(self._bound_high())}"

    def allows(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if isinstance(value, float) and math.isnan(value):
            return False
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        return self.high is None or not (value > self.high or (value == self.high and not self.high_inclusive))

    @property
    def kind(self) -> str:
        return "a whole number" if self.integer else "a number"

    def example_outside(self) -> float:
        """A value this range refuses (for the tests and the docs)."""
        if self.low is not None:
            return self.low - 1 if self.low_inclusive else self.low
        high = self._bound_high()
        return high + 1 if self.high_inclusive else high

    def _bound_high(self) -> float:
        """The upper bound of a range without a lower one (a range has at least one bound)."""
        if self.high is None:
            raise ValueError(f"the range of {self.field} has no bound: give it low or high")
        return self.high

    def rule(self) -> Rule:
        unset = " or null" if self.optional else ""
        return Rule(
            id=self.rule_id,
            fields=(self.field,),
            holds=lambda cfg, ctx: self.allows(read_field(cfg, self.field)),
            message=(
                f"{self.field} must be {self.kind} {self.describe()}{unset}" + (f": {self.why}" if self.why else "")
            ),
            fix=f"set {self.field} to a value {self.describe()}",
            group="ranges",
        )


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _positive_int(field: str, why: str, optional: bool = False) -> FieldRange:
    return FieldRange(field, low=1, optional=optional, why=why, integer=True)


RANGES: tuple[FieldRange, ...] = (
    _positive_int("model.seq_length", "a sequence needs at least one token"),
    _positive_int("model.num_layers", "the model needs at least one layer"),
    _positive_int("model.hidden_size", "the hidden size sizes every weight"),
    _positive_int("model.num_attention_heads", "attention needs at least one head"),
    _positive_int("model.num_query_groups", "grouped-query attention needs at least one group", optional=True),
    _positive_int("model.kv_channels", "the per-head width sizes q, k and v", optional=True),
    _positive_int("model.ffn_hidden_size", "the dense MLP width", optional=True),
    _positive_int("model.num_moe_experts", "an MoE layer needs experts (null for a dense model)", optional=True),
    _positive_int("model.moe_ffn_hidden_size", "the expert MLP width", optional=True),
    _positive_int("model.moe_router_topk", "each token goes to at least one expert"),
    _positive_int("model.make_vocab_size_divisible_by", "the vocabulary is padded to a multiple of it"),
    _positive_int("model.tensor_model_parallel_size", "a parallel size counts GPUs"),
    _positive_int("model.pipeline_model_parallel_size", "a parallel size counts GPUs"),
    _positive_int("model.virtual_pipeline_model_parallel_size", "model chunks per pipeline stage", optional=True),
    _positive_int("model.context_parallel_size", "a parallel size counts GPUs"),
    _positive_int("model.expert_model_parallel_size", "a parallel size counts GPUs"),
    _positive_int("model.expert_tensor_parallel_size", "a parallel size counts GPUs", optional=True),
    FieldRange("model.hidden_dropout", low=0, high=1, why="a probability"),
    FieldRange("model.attention_dropout", low=0, high=1, why="a probability"),
    FieldRange("model.layernorm_epsilon", low=0, low_inclusive=False, why="it keeps the norm's division finite"),
    FieldRange("model.init_method_std", low=0, why="a standard deviation"),
    _positive_int("train.train_iters", "training needs at least one iteration (--max_steps)"),
    _positive_int("train.global_batch_size", "samples per optimizer step"),
    _positive_int("train.micro_batch_size", "samples per forward pass"),
    _positive_int("train.eval_interval", "iterations between evaluations (null: none)", optional=True),
    FieldRange("train.eval_iters", low=0, why="a count of batches"),
    FieldRange(
        "train.exit_duration_in_mins",
        low=0,
        low_inclusive=False,
        optional=True,
        why="the run stops and saves after that many minutes (null: no limit)",
    ),
    FieldRange("train.manual_gc_interval", low=0, why="iterations between collections (0: never)"),
    FieldRange("optimizer.lr", low=0, why="a negative learning rate climbs the loss"),
    FieldRange("optimizer.min_lr", low=0, optional=True, why="the floor of the learning-rate schedule"),
    FieldRange("optimizer.weight_decay", low=0, why="negative decay grows the weights"),
    FieldRange("optimizer.clip_grad", low=0, why="a gradient-norm bound (0: no clipping)"),
    FieldRange("optimizer.adam_beta1", low=0, high=1, high_inclusive=False, why="Adam's moment decay"),
    FieldRange("optimizer.adam_beta2", low=0, high=1, high_inclusive=False, why="Adam's moment decay"),
    FieldRange("optimizer.adam_eps", low=0, low_inclusive=False, why="it keeps Adam's division finite"),
    FieldRange("scheduler.lr_warmup_iters", low=0, why="a count of iterations"),
    FieldRange("scheduler.lr_warmup_init", low=0, why="the learning rate warm-up starts from"),
    _positive_int(
        "scheduler.lr_decay_iters", "iterations the learning rate decays over (null: train_iters)", optional=True
    ),
    FieldRange("scheduler.start_weight_decay", low=0, optional=True, why="negative decay grows the weights"),
    FieldRange("scheduler.end_weight_decay", low=0, optional=True, why="negative decay grows the weights"),
    _positive_int("checkpoint.save_interval", "iterations between checkpoints (null: none)", optional=True),
    _positive_int("logger.log_interval", "iterations between log lines"),
    _positive_int("dist.distributed_timeout_minutes", "how long a collective may wait for a peer"),
    FieldRange("dataset.num_workers", low=0, why="data-loader processes per rank (0: in the rank)"),
    _positive_int("tokenizer.vocab_size", "the NullTokenizer's vocabulary (null: model.vocab_size)", optional=True),
    FieldRange("rng.seed", low=0, high=2**32 - 1, why="numpy accepts seeds in [0, 2^32 - 1]"),
    _positive_int("emulation.world_size", "GPUs of the emulated layout (null: a real world)", optional=True),
    FieldRange("emulation.rank", low=0, integer=True, why="the rank this process plays"),
    _positive_int(
        "emulation.gpus_per_node", "GPUs per node of the emulated cluster (null: the preset's)", optional=True
    ),
    FieldRange(
        "emulation.comm_sms",
        low=0,
        integer=True,
        optional=True,
        why="SMs a modeled collective keeps busy (null: the preset's)",
    ),
    FieldRange(
        "emulation.intra_node_gbps",
        low=0,
        low_inclusive=False,
        optional=True,
        why="NVLink GB/s a GPU achieves per direction (null: the preset's)",
    ),
    FieldRange(
        "emulation.inter_node_gbps",
        low=0,
        low_inclusive=False,
        optional=True,
        why="GB/s one NIC achieves per direction (null: the preset's)",
    ),
    FieldRange(
        "emulation.nics_per_gpu",
        low=0,
        low_inclusive=False,
        optional=True,
        why="NICs per GPU of a node (null: the preset's)",
    ),
    FieldRange("emulation.intra_node_latency_us", low=0, optional=True, why="microseconds (null: the preset's)"),
    FieldRange("emulation.inter_node_latency_us", low=0, optional=True, why="microseconds (null: the preset's)"),
)
"""Every numeric setting with a range, in the order they are reported and documented."""

RANGE_RULES: tuple[Rule, ...] = tuple(r.rule() for r in RANGES)


def ranges_markdown() -> str:
    """The docs table of :data:`RANGES`."""
    rows = [
        f"| `{r.field}` | {'whole, ' if r.integer else ''}{r.describe()}{' or null' if r.optional else ''} | {r.why} |"
        for r in RANGES
    ]
    return "| field | allowed | why |\n|---|---|---|\n" + "\n".join(rows) + "\n"


def within(cfg: ConfigContainer, ctx: RuleContext, field: str) -> bool:
    """Whether ``field`` satisfies its own range (other rules skip values the range rule reports)."""
    return next(r for r in RANGES if r.field == field).allows(read_field(cfg, field))


DOCS_PATH = "docs/performance/reliability.md"
DOCS_BEGIN = (
    "<!-- ranges: generated by `uv run python -m megatron.bridge.training.config_stages.schema.field_ranges "
    "--write-docs` -->"
)
DOCS_END = "<!-- end of ranges -->"


def render_docs(page: str) -> str:
    """``page`` with the block between the markers replaced by the current table."""
    head, _, rest = page.partition(DOCS_BEGIN)
    _, _, tail = rest.partition(DOCS_END)
    return f"{head}{DOCS_BEGIN}\n{ranges_markdown()}{DOCS_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The numeric ranges table of the reliability page.")
    parser.add_argument("--write-docs", action="store_true", help=f"regenerate the table in {DOCS_PATH}")
    parser.add_argument("--root", default=".", help="repository root")
    args = parser.parse_args(argv)
    if not args.write_docs:
        print(ranges_markdown(), end="")
        return 0
    path = Path(args.root) / DOCS_PATH
    path.write_text(render_docs(path.read_text()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
