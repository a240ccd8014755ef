"""A pretraining script as a Megatron-Bridge user writes it, run under ``torch.distributed.run`` on CPU.

Everything a user would type is here: a recipe called with Megatron-Bridge's keyword arguments
(``mock=True``, ``train_iters=...``, ``dir=``/``name=``), a NullTokenizer carrying the vocabulary
(``model.vocab_size`` left unset, taken from the tokenizer), a forward step taking the training
state first, and ``pretrain(config=cfg, forward_step_func=forward_step)``. One launch checks:

1. ``pretrain(..., callbacks=[...])`` is refused with an ``ArgumentError`` naming ``callbacks``,
   before any process group exists;
2. the run trains ``FIRST_ITERS`` iterations with the user's forward step, on the vocabulary of the
   tokenizer, and saves into ``<dir>/<name>/checkpoints``;
3. the same recipe call with a longer ``train_iters`` resumes from that checkpoint (the recipe sets
   ``checkpoint.load`` because the directory now exists) and trains on to ``SECOND_ITERS``.

Rank 0 writes ``results.json`` into the directory given as the only argument.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import TokenizerConfig
from megatron.bridge.training.errors import ArgumentError
from megatron.bridge.training.gpt_step import forward_step as gpt_forward_step
from megatron.bridge.training.pretrain import pretrain

FIRST_ITERS = 3
SECOND_ITERS = 5
VOCAB = 1024

seen_iterations: list[int] = []


def forward_step(state, data_iterator, model, return_schedule_plan=False):
    """Megatron-Bridge's form: the training state first (its iteration is recorded)."""
    seen_iterations.append(state.train_state.iteration)
    return gpt_forward_step(data_iterator, model, return_schedule_plan)


def user_config(out: Path, train_iters: int):
    """What the user writes: a recipe with Megatron-Bridge's keywords, then a few fields."""
    cfg = qwen3_moe_tiny_pretrain_config(
        mock=True, train_iters=train_iters, global_batch_size=2, micro_batch_size=1, dir=str(out), name="run"
    )
    cfg.dist.device = "cpu"
    cfg.model.layer_spec = "local"
    cfg.model.vocab_size = None
    cfg.tokenizer = TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=VOCAB)
    cfg.logger.steady_state_window = [1, 2]
    return cfg


class UserCallback:
    """A Megatron-Bridge callback object; this training loop would never call it."""

    def on_train_step_end(self, context) -> None:
        raise AssertionError("never called")


def main(out: Path) -> None:
    results: dict = {}
    try:
        pretrain(config=user_config(out, FIRST_ITERS), forward_step_func=forward_step, callbacks=[UserCallback()])
    except ArgumentError as exc:
        results["callbacks_error"] = str(exc)
        results["callbacks_error_is_type_error"] = isinstance(exc, TypeError)
        results["callbacks_rules"] = [v.rule for v in exc.violations]
    results["process_group_after_refusal"] = torch.distributed.is_initialized()

    first = user_config(out, FIRST_ITERS)
    results["first_load"] = first.checkpoint.load
    done = pretrain(config=first, forward_step_func=forward_step)
    results["first_losses"] = done.losses
    results["first_iteration"] = done.state.iteration
    results["first_seen_iterations"] = sorted(set(seen_iterations))
    seen_iterations.clear()

    second = user_config(out, SECOND_ITERS)
    results["second_load"] = second.checkpoint.load
    resumed = pretrain(config=second, forward_step_func=forward_step)
    results["second_losses"] = resumed.losses
    results["second_iteration"] = resumed.state.iteration
    results["second_seen_iterations"] = sorted(set(seen_iterations))
    results["summary_path"] = resumed.summary_path
    results["user_vocab_size"] = second.model.vocab_size
    if os.environ.get("RANK", "0") == "0":
        (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
