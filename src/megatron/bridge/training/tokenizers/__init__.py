"""Tokenizer settings of a run (:class:`~megatron.bridge.training.tokenizers.config.TokenizerConfig`)."""

from megatron.bridge.training.tokenizers.config import TokenizerConfig

__all__ = ["TokenizerConfig"]
