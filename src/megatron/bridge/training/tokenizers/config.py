"""``TokenizerConfig``: the tokenizer section of a run's configuration.

Defined here, under the module path Megatron-Bridge scripts import it from; it is the same class as
``megatron.bridge.training.config.TokenizerConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from megatron.bridge.utils.strict_fields import StrictFields


@dataclass(kw_only=True)
class TokenizerConfig(StrictFields):
    """Tokenizer. ``NullTokenizer`` needs no files: token ids are used as they are."""

    tokenizer_type: Literal["NullTokenizer", "HuggingFaceTokenizer"] = "NullTokenizer"
    tokenizer_model: Optional[str] = None
    """Path or name of a Hugging Face tokenizer (only for ``HuggingFaceTokenizer``)."""
    vocab_size: Optional[int] = None
    """Vocabulary of the ``NullTokenizer``; ``None`` uses ``model.vocab_size``."""
    hf_tokenizer_kwargs: Optional[dict[str, Any]] = None
    """Extra keyword arguments for the Hugging Face tokenizer (only for ``HuggingFaceTokenizer``)."""


__all__ = ["TokenizerConfig"]
