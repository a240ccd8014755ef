"""User input as an error message shows it: cut to a bounded length, whatever was given.

A listed problem repeats the value it refuses; a value of megabytes (a long override, what
``${...}`` references made of it, a path of thousands of characters) would make the message as
long. These helpers keep the start and the end of such a value and say that the middle is cut.
"""

from __future__ import annotations

import reprlib
from typing import Any

SHOWN_CHARS = 160
"""The most characters of one given text a message repeats."""
SHOWN_VALUE_CHARS = 400
"""The most characters of one value (a list or mapping of such texts) a message repeats."""

_BOUNDED = reprlib.Repr(
    maxlevel=3,
    maxdict=6,
    maxlist=6,
    maxtuple=6,
    maxset=6,
    maxstring=SHOWN_CHARS,
    maxlong=SHOWN_CHARS,
    maxother=SHOWN_CHARS,
)


class _Shown:
    """Stands in for a long value in a :class:`~megatron.bridge.training.errors.Violation`: its
    ``repr`` is the value's, with the middle cut."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def shown(value: Any) -> Any:
    """``value`` itself when its ``repr`` is short; else a stand-in whose ``repr`` is cut to a bounded
    length (reading only the part of a large list or mapping that is shown)."""
    text = _BOUNDED.repr(value)
    if "..." not in text and len(text) <= SHOWN_VALUE_CHARS:
        return value
    return _Shown(short_text(text, SHOWN_VALUE_CHARS))


def short_text(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` with its middle cut when it is longer than ``limit`` characters (for names and keys
    a message repeats inside its sentence)."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]}[...]{text[-half:]}"
