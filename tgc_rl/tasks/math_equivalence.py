"""Math answers: math-verify's symbolic equality, with the lenient last-number match as a fallback.

math-verify's own timeouts use `signal.alarm`, which only works in a main thread; we turn them off
(`parsing_timeout=None`, `timeout_seconds=None`) and rely on the reward pool, which kills a worker
stuck on one sample (e.g. `9^{9^{9^9}}` against a square root) at its deadline.
"""

from __future__ import annotations

import logging

from tgc_rl.tasks.answers import last_number
from tgc_rl.tasks.base import Score

# math-verify logs a warning on every call when its alarm-based timeouts are off; we enforce our own.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def verify_math(answer: str, response: str) -> Score:
    """1.0 when the response's final answer equals `answer` symbolically (math-verify) or by last number."""
    from math_verify import parse, verify

    gold = parse(answer, parsing_timeout=None)
    if not gold:  # a plain-text gold answer math-verify cannot read; try it as inline LaTeX
        gold = parse(f"${answer}$", parsing_timeout=None)
    pred = parse(response, parsing_timeout=None)
    # A number is answered by a number: math-verify keeps "75 + 58" unevaluated and finds it equal to 133, so
    # restating the question ("75 + 58 =") would score as solving it (a policy learns that in ten steps).
    restated = bool(gold and pred and _is_number(gold[0]) and not _is_number(pred[0]))
    if gold and pred and not restated and verify(gold, pred, timeout_seconds=None):
        return Score(1.0, detail="math-verify")
    got, want = last_number(response), last_number(answer)
    if got is not None and got == want:
        return Score(1.0, detail="last-number")
    if not pred and got is None:
        return Score(0.0, detail="no answer found")
    return Score(0.0, detail="wrong answer")


def _is_number(parsed: object) -> bool:
    return bool(getattr(parsed, "is_Number", False))


def warm_up() -> None:
    """The first symbolic comparison costs sympy's warm-up (~0.5 s); pay it before the first deadline."""
    verify_math("\\frac{1}{2}", "0.5")
