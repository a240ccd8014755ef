"""The model's vocabulary from the NullTokenizer when ``model.vocab_size`` is unset (as Megatron-Bridge
takes it from the tokenizer), through ``cfg.validate()``; a config with no vocabulary anywhere, or a
tokenizer larger than the model, is refused before launch."""

from __future__ import annotations

import pytest

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import TokenizerConfig
from megatron.bridge.training.errors import ConfigValidationError

# case -> (model.vocab_size, tokenizer, the vocabulary the run builds)
VOCABULARIES = {
    "from the NullTokenizer": (None, TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=1000), 1000),
    "model's own": (1024, TokenizerConfig(tokenizer_type="NullTokenizer"), 1024),
    "both, tokenizer smaller": (1024, TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=1000), 1024),
}


@pytest.mark.parametrize("case", list(VOCABULARIES))
def test_the_run_builds_the_vocabulary_it_is_given(case) -> None:
    model_vocab, tokenizer, expected = VOCABULARIES[case]
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.vocab_size, cfg.tokenizer = model_vocab, tokenizer
    assert cfg.validate().model.vocab_size == expected
    assert cfg.model.vocab_size == model_vocab  # the user's field stays as written


# case -> (model.vocab_size, tokenizer, the rule reported)
REFUSED = {
    "no vocabulary anywhere": (None, TokenizerConfig(tokenizer_type="NullTokenizer"), "vocab-size-set"),
    "a Hugging Face tokenizer without model.vocab_size": (
        None,
        TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="/tok"),
        "vocab-size-set",
    ),
    "tokenizer larger than the model": (
        1000,
        TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=1024),
        "tokenizer-vocab-fits-model",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_vocabulary_that_cannot_work_is_refused(case) -> None:
    model_vocab, tokenizer, rule = REFUSED[case]
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.vocab_size, cfg.tokenizer = model_vocab, tokenizer
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate()
    assert rule in {v.rule for v in info.value.violations}
