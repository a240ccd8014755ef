"""The one did-you-mean wording shared by every unknown-name error (config attributes, dotted
overrides, Hydra-style overrides; their own tests go through those entry points)."""

from __future__ import annotations

import pytest

from megatron.bridge.training.errors import did_you_mean


@pytest.mark.parametrize(
    "name, choices, prefix, expected",
    [
        ("weight_decy", ["weight_decay", "lr", "adam_beta1"], "", "did you mean weight_decay?"),
        (
            "hiden_size",
            ["hidden_size", "ffn_hidden_size", "num_layers"],
            "model.",
            "did you mean model.hidden_size or model.ffn_hidden_size?",
        ),
        ("zzz", ["train_iters"], "", None),
    ],
)
def test_closest_names_come_with_their_prefix_and_none_when_nothing_is_close(name, choices, prefix, expected) -> None:
    assert did_you_mean(name, choices, prefix) == expected
