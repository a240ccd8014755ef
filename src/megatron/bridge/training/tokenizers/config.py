"""``TokenizerConfig``: the tokenizer section of a run's configuration.

Defined here, under the module path Megatron-Bridge scripts import it from; it is the same class as
``megatron.bridge.training.config.TokenizerConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from megatron.bridge.utils.strict_fields import StrictFields


@dataclass(kw_only=True)
class TokenizerConfig(StrictFields):
    """Tokenizer. ``NullTokenizer`` needs no files: token ids are used as they are."""

    tokenizer_type: Literal["NullTokenizer", "HuggingFaceTokenizer"] = "NullTokenizer"
    tokenizer_model: str | None = None
    """Path or name of a Hugging Face tokenizer (only for ``HuggingFaceTokenizer``)."""
    vocab_size: int | None = None
    """Vocabulary of the ``NullTokenizer``; ``None`` uses ``model.vocab_size``. With
    ``model.vocab_size`` unset it is the model's vocabulary too (as in Megatron-Bridge); with both set
    it must not exceed the model's (rule ``tokenizer-vocab-fits-model``)."""
    hf_tokenizer_kwargs: dict[str, Any] | None = None
    """Extra keyword arguments for the Hugging Face tokenizer (only for ``HuggingFaceTokenizer``)."""


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def vocab_size_from_tokenizer(cfg: Any) -> int | None:
    """The model's vocabulary when ``model.vocab_size`` is unset: the NullTokenizer's
    ``tokenizer.vocab_size`` (Megatron-Bridge takes the model's vocabulary from the tokenizer), else
    ``None``. A Hugging Face tokenizer's vocabulary is known only once it is loaded, too late for the
    checks made before launch (memory, checkpoint shape), so it is not taken."""
    if cfg.model.vocab_size is not None or cfg.tokenizer.tokenizer_type != "NullTokenizer":
        return None
    return cfg.tokenizer.vocab_size if _positive_int(cfg.tokenizer.vocab_size) else None


def derive_vocab_size(cfg: Any) -> None:
    """Write :func:`vocab_size_from_tokenizer` into ``cfg.model.vocab_size`` of a ``ConfigContainer``
    (the resolution's private copy: the user's ``model.vocab_size`` stays unset, as written)."""
    vocab = vocab_size_from_tokenizer(cfg)
    if vocab is not None:
        cfg.model.vocab_size = vocab


__all__ = ["TokenizerConfig", "derive_vocab_size", "vocab_size_from_tokenizer"]
