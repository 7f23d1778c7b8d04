"""Lenient answer extraction shared by the built-in math tasks."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def last_number(text: str) -> str | None:
    """The answer a small chat model most often means: a boxed value, else the last number in the text."""
    boxed = _BOXED.findall(text)
    if boxed:
        found = _NUMBER.findall(boxed[-1])
        if found:
            return _normalise(found[-1])
    found = _NUMBER.findall(text)
    return _normalise(found[-1]) if found else None


def _normalise(number: str) -> str:
    number = number.replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return "0" if number in ("-0", "") else number
