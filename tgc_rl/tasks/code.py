"""Built-in code task (`task.name: code`): small generated programming problems with tests.

Each family makes a problem from a seeded RNG, computes its test cases with a reference
implementation here, and keeps a reference solution in `meta["reference"]` (tests use it to show
every item is solvable). Half the families are stdin/stdout programs, half are functions checked by
asserts. Responses are scored in the code sandbox (`tgc_rl.tasks.code_tests`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from tgc_rl.tasks.base import TaskItem
from tgc_rl.tasks.code_tests import SandboxedCodeTask
from tgc_rl.tasks.grants import UNSAFE_SANDBOX
from tgc_rl.tasks.params import SANDBOX_DOC, SandboxMode, TaskParams, needs_grant

_REPLY = "Reply with the complete program in a ```python code block."


@dataclass(frozen=True)
class _Problem:
    prompt: str
    tests: dict
    reference: str


def _ints(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(-50, 50) for _ in range(n)]


def _sum_line(rng: random.Random, cases: int) -> _Problem:
    inputs = [_ints(rng, rng.randint(1, 6)) for _ in range(cases)]
    return _Problem(
        "Write a Python program that reads one line of space-separated integers from standard input "
        f"and prints their sum. {_REPLY}",
        {"style": "stdio", "cases": [[" ".join(map(str, xs)) + "\n", f"{sum(xs)}\n"] for xs in inputs]},
        "print(sum(int(x) for x in input().split()))\n",
    )


def _max_line(rng: random.Random, cases: int) -> _Problem:
    inputs = [_ints(rng, rng.randint(1, 6)) for _ in range(cases)]
    return _Problem(
        "Write a Python program that reads one line of space-separated integers from standard input "
        f"and prints the largest of them. {_REPLY}",
        {"style": "stdio", "cases": [[" ".join(map(str, xs)) + "\n", f"{max(xs)}\n"] for xs in inputs]},
        "print(max(int(x) for x in input().split()))\n",
    )


def _scale(rng: random.Random, cases: int) -> _Problem:
    k = rng.randint(2, 9)
    inputs = [rng.randint(-100, 100) for _ in range(cases)]
    return _Problem(
        f"Write a Python program that reads an integer n from standard input and prints n * {k}. {_REPLY}",
        {"style": "stdio", "cases": [[f"{n}\n", f"{n * k}\n"] for n in inputs]},
        f"print(int(input()) * {k})\n",
    )


def _reverse_words(rng: random.Random, cases: int) -> _Problem:
    words = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "river", "stone"]
    inputs = [rng.sample(words, rng.randint(1, 5)) for _ in range(cases)]
    return _Problem(
        "Write a Python program that reads one line of words separated by spaces from standard input "
        f"and prints the words in reverse order, separated by single spaces. {_REPLY}",
        {"style": "stdio", "cases": [[" ".join(ws) + "\n", " ".join(reversed(ws)) + "\n"] for ws in inputs]},
        "print(' '.join(reversed(input().split())))\n",
    )


def _add_constant(rng: random.Random, cases: int) -> _Problem:
    k = rng.randint(1, 20)
    xs = [rng.randint(-100, 100) for _ in range(cases)]
    return _Problem(
        f"Write a Python function `add_constant(x)` that returns x + {k}. {_REPLY}",
        {
            "style": "function",
            "entry_point": "add_constant",
            "test": "\n".join(f"assert add_constant({x}) == {x + k}" for x in xs),
        },
        f"def add_constant(x):\n    return x + {k}\n",
    )


def _is_multiple(rng: random.Random, cases: int) -> _Problem:
    k = rng.randint(2, 9)
    xs = [rng.randint(0, 100) for _ in range(cases)] + [k * rng.randint(1, 9)]
    return _Problem(
        f"Write a Python function `is_multiple(n)` that returns True if n is divisible by {k} and False "
        f"otherwise. {_REPLY}",
        {
            "style": "function",
            "entry_point": "is_multiple",
            "test": "\n".join(f"assert is_multiple({x}) is {x % k == 0}" for x in xs),
        },
        f"def is_multiple(n):\n    return n % {k} == 0\n",
    )


def _count_char(rng: random.Random, cases: int) -> _Problem:
    c = rng.choice("aeiost")
    alphabet = "aeiostnrl "
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(cases)]
    return _Problem(
        f"Write a Python function `count_char(s)` that returns how many times the letter '{c}' occurs in "
        f"the string s. {_REPLY}",
        {
            "style": "function",
            "entry_point": "count_char",
            "test": "\n".join(f"assert count_char({t!r}) == {t.count(c)}" for t in texts),
        },
        f"def count_char(s):\n    return s.count({c!r})\n",
    )


def _clamp(rng: random.Random, cases: int) -> _Problem:
    lo = rng.randint(-20, 0)
    hi = rng.randint(1, 20)
    xs = [rng.randint(-40, 40) for _ in range(cases)] + [lo - 1, hi + 1]
    return _Problem(
        f"Write a Python function `clamp(x)` that returns x limited to the range [{lo}, {hi}]: {lo} if x is "
        f"smaller, {hi} if x is larger, else x. {_REPLY}",
        {
            "style": "function",
            "entry_point": "clamp",
            "test": "\n".join(f"assert clamp({x}) == {min(max(x, lo), hi)}" for x in xs),
        },
        f"def clamp(x):\n    return min(max(x, {lo}), {hi})\n",
    )


FAMILIES: dict[str, Callable[[random.Random, int], _Problem]] = {
    "sum_line": _sum_line,
    "max_line": _max_line,
    "scale": _scale,
    "reverse_words": _reverse_words,
    "add_constant": _add_constant,
    "is_multiple": _is_multiple,
    "count_char": _count_char,
    "clamp": _clamp,
}


def _refuse_unknown(unknown: dict[str, Any], task: str, known: list[str]) -> None:
    if unknown:
        raise ValueError(f"task.params: unknown field(s) {sorted(unknown)} for task {task!r}; known: {known}")


class CodeParams(TaskParams):
    families: list[str] | None = Field(
        None, min_length=1, max_length=64, description="Problem families (default all)."
    )
    cases: int = Field(3, ge=1, le=100, description="Test cases per problem.")
    timeout_s: float = Field(5.0, gt=0, le=120, description="Wall-clock limit of one test run.")
    sandbox: SandboxMode = Field(
        "bwrap", description=SANDBOX_DOC, json_schema_extra=needs_grant(UNSAFE_SANDBOX)
    )
    memory_mb: int | None = Field(None, ge=16, le=65_536, description="Address-space limit of a test run.")
    partial_credit: bool = Field(
        False, description="Reward the share of passed cases instead of all-or-nothing."
    )


class CodeTask(SandboxedCodeTask):
    name = "code"
    params_model = CodeParams

    def __init__(
        self,
        seed: int = 0,
        families: list[str] | tuple[str, ...] | None = None,
        cases: int = 3,
        timeout_s: float = 5.0,
        sandbox: str = "bwrap",
        memory_mb: int | None = None,
        partial_credit: bool = False,
        **unknown: Any,
    ):
        _refuse_unknown(
            unknown, "code", ["families", "cases", "timeout_s", "sandbox", "memory_mb", "partial_credit"]
        )
        chosen = list(families) if families is not None else list(FAMILIES)
        bad = [f for f in chosen if f not in FAMILIES]
        if bad or not chosen:
            raise ValueError(f"task.params.families {chosen!r}: choose from {sorted(FAMILIES)}")
        if not 1 <= cases <= 100:
            raise ValueError(f"task.params.cases={cases}: must be between 1 and 100")
        if not timeout_s > 0:
            raise ValueError(f"task.params.timeout_s={timeout_s}: must be > 0")
        if sandbox not in ("bwrap", "unsafe_local"):
            raise ValueError(f"task.params.sandbox {sandbox!r}: use 'bwrap' (default) or 'unsafe_local'")
        self.seed, self.families, self.cases, self.timeout_s = seed, chosen, cases, float(timeout_s)
        self.sandbox_mode, self.memory_mb, self.partial_credit = sandbox, memory_mb, partial_credit

    def item(self, index: int) -> TaskItem:
        rng = random.Random(f"code:{self.seed}:{index}")
        family = rng.choice(self.families)
        problem = FAMILIES[family](rng, self.cases)
        tests = {**problem.tests, "timeout_s": self.timeout_s}
        return TaskItem(
            id=f"code-{self.seed}-{index}",
            prompt=problem.prompt,
            kind="code",
            meta={"tests": tests, "family": family, "reference": problem.reference},
        )
