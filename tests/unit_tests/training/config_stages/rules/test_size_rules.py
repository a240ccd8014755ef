"""The size rules: a step, sample or token count the dataset build cannot finish is refused by
``validate()`` and by the harness before launch (``--max_steps 99999999999999999999`` passed and then
kept every rank in megatron-core's mock-dataset build for over ten minutes); the recipes pass."""

from __future__ import annotations

import io

import pytest

import megatron.bridge.perf.harness.execution as execution_module
import megatron.bridge.perf.harness.run as run_module
from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config_stages.rules.size_rules import SIZE_RULES
from megatron.bridge.training.errors import ConfigValidationError

ABSURD_STEPS = 99999999999999999999


def _set(cfg, **values):
    for dotted, value in values.items():
        section, name = dotted.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


def _cpu(cfg):
    cfg.dist.device = "cpu"
    return cfg


# rule id -> (world size, config that breaks the rule, config that satisfies it, texts of the refusal)
CASES = {
    "dataset-tokens-bounded": (
        16,
        lambda: _set(qwen3_30b_a3b_pretrain_config(), train__train_iters=ABSURD_STEPS),
        lambda: _set(qwen3_30b_a3b_pretrain_config(), train__train_iters=10_000_000),  # 4.3e+13 tokens: the longest
        [f"train.train_iters={ABSURD_STEPS}", "tokens='4.19e+26 (1.02e+23 training", "more than 1e+15 tokens"],
    ),
    "dataset-index-fits-host-memory": (
        2,
        lambda: _set(_cpu(qwen3_moe_tiny_pretrain_config()), train__train_iters=10**10),
        lambda: _set(_cpu(qwen3_moe_tiny_pretrain_config()), train__train_iters=1000),
        ["estimate='at least", "for the 2 rank(s) on this host", "on this host'", "dist.device='cpu'"],
    ),
}


def test_every_size_rule_has_cases():
    assert set(CASES) == {rule.id for rule in SIZE_RULES}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_a_size_the_dataset_build_cannot_finish_is_refused_by_validate_and_a_real_size_passes(rule_id):
    world, breaks, satisfies, texts = CASES[rule_id]
    with pytest.raises(ConfigValidationError) as info:
        breaks().validate(world_size=world)
    assert [v.rule for v in info.value.violations] == [rule_id], info.value
    text = info.value.violations[0].format()
    for fragment in texts:
        assert fragment in text, (fragment, text)
    assert "fix: give --max_steps" in text
    satisfies().validate(world_size=world)


def test_evaluation_batches_count_too():
    cfg = _set(qwen3_30b_a3b_pretrain_config(), train__eval_iters=ABSURD_STEPS)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=16)
    assert [v.rule for v in info.value.violations] == ["dataset-tokens-bounded"]


def test_the_harness_refuses_absurd_steps_before_launch(monkeypatch, tmp_path):
    """The issue's command: refused with the rule, exit 2, nothing launched (it launched and hung)."""

    def launched(*args, **kwargs):
        raise AssertionError("launched a run whose dataset build cannot finish")

    monkeypatch.setattr(execution_module, "run_plan", launched)
    out = io.StringIO()
    code = run_module.main(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "cpu",
            "-ng",
            "2",
            "-ep",
            "2",
            "--max_steps",
            str(ABSURD_STEPS),
            "-l",
            str(tmp_path / "run"),
        ],
        out=out,
    )
    text = out.getvalue()
    assert code == 2, text
    assert "[dataset-tokens-bounded]" in text and f"train.train_iters={ABSURD_STEPS}" in text, text
    assert "nothing was launched" in text and "Traceback" not in text
