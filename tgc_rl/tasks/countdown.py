"""Built-in countdown task (`task.name: countdown`): reach a target number with a few given numbers.

Each item gives 3-4 numbers (`min_count`..`max_count`) and a target made by a random expression over all of them,
so every item has a solution (kept as the item's `answer`). A response is right when its expression uses only the
given numbers, each at most once, `+ - * /` and parentheses, and equals the target in exact rational arithmetic
(`8 / (3 - 8 / 3)` is 24). The expression is the last `<answer>...</answer>` of the response, else its last
non-empty line; what follows an `=` is ignored. It is read by a small bounded parser, never by Python's eval.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from tgc_rl.tasks.base import Score, Task, TaskItem
from tgc_rl.tasks.params import MAX_TEMPLATE_CHARS, TaskParams, check_template, fill_template

if TYPE_CHECKING:
    from pydantic import BaseModel

MAX_EXPRESSION_CHARS = 256  # a longer reading is refused before it is parsed
MAX_DEPTH = 32  # nested parentheses: more is refused, never a RecursionError
_ATTEMPTS = 100  # random expressions tried per item before the sum of the numbers is the target
_SYNONYMS = {"×": "*", "÷": "/", "−": "-", "\\times": "*", "\\div": "/", "\\cdot": "*"}
DEFAULT_TEMPLATE = (
    "Using the numbers {numbers}, write an arithmetic expression that equals {target}. You may use +, -, *, / "
    "and parentheses, and each number at most once. Give the expression in <answer></answer> tags, for "
    "example <answer>(1 + 2) * 3</answer>."
)


class CountdownParams(TaskParams):
    min_count: int = Field(3, ge=2, le=6, description="Fewest numbers an item gives.")
    max_count: int = Field(4, ge=2, le=6, description="Most numbers an item gives (>= min_count).")
    min_number: int = Field(1, ge=1, le=1000, description="Smallest number.")
    max_number: int = Field(25, ge=1, le=1000, description="Largest number (>= min_number).")
    max_target: int = Field(
        100,
        ge=2,
        le=1_000_000,
        description="Largest target; at least max_count * max_number (the sum of the numbers, the fallback "
        "target of an item whose random expressions all miss the range, must fit).",
    )
    template: str = Field(
        DEFAULT_TEMPLATE,
        min_length=1,
        max_length=MAX_TEMPLATE_CHARS,
        description="Question; slots {numbers} (comma-separated) and {target}, both required.",
    )

    @model_validator(mode="after")
    def _ranges(self) -> CountdownParams:
        if self.min_count > self.max_count:
            raise ValueError("need min_count <= max_count")
        if self.min_number > self.max_number:
            raise ValueError("need min_number <= max_number")
        if self.max_target < self.max_count * self.max_number:
            raise ValueError(
                f"max_target={self.max_target} is below max_count * max_number = "
                f"{self.max_count * self.max_number}; raise max_target or lower max_number"
            )
        return self

    @field_validator("template")
    @classmethod
    def _slots(cls, v: str) -> str:
        return check_template(v, ("numbers", "target"), required=("numbers", "target"))


class Refused(ValueError):
    """Why an expression is not an answer (a verdict: reward 0, the reason in the score's detail)."""


class _Parser:
    """Recursive descent over integers, `+ - * /` and parentheses; each number is taken from `available`."""

    def __init__(self, text: str, available: Counter[int]):
        self.tokens, self.pos, self.available = _tokens(text), 0, available

    def parse(self) -> Fraction:
        value = self._sum(0)
        if self.pos < len(self.tokens):
            raise Refused(f"unexpected {self.tokens[self.pos]!r}")
        return value

    def _next(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _sum(self, depth: int) -> Fraction:
        value = self._product(depth)
        while (op := self._next()) in ("+", "-"):
            self.pos += 1
            right = self._product(depth)
            value = value + right if op == "+" else value - right
        return value

    def _product(self, depth: int) -> Fraction:
        value = self._atom(depth)
        while (op := self._next()) in ("*", "/"):
            self.pos += 1
            right = self._atom(depth)
            if op == "/" and right == 0:
                raise Refused("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def _atom(self, depth: int) -> Fraction:
        token = self._next()
        self.pos += 1
        if token == "(":
            if depth >= MAX_DEPTH:
                raise Refused(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self._sum(depth + 1)
            if self._next() != ")":
                raise Refused("a '(' is not closed")
            self.pos += 1
            return value
        if token is not None and token.isdigit():
            number = int(token)
            if self.available[number] <= 0:
                raise Refused(f"{number} is not one of the numbers, or is used more often than given")
            self.available[number] -= 1
            return Fraction(number)
        raise Refused("the expression ends too soon" if token is None else f"unexpected {token!r}")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "0123456789":
            j = i
            while j < len(text) and text[j] in "0123456789":
                j += 1
            out.append(text[i:j])
            i = j
        elif c in "+-*/()":
            out.append(c)
            i += 1
        else:
            raise Refused(f"{c!r} at character {i}: only integers, + - * / and parentheses are read")
    return out


def evaluate(expression: str, numbers: list[int]) -> Fraction:
    """The exact value of `expression`, using each of `numbers` at most once; raises Refused saying why not."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise Refused(
            f"the expression is {len(expression)} characters; at most {MAX_EXPRESSION_CHARS} are read"
        )
    return _Parser(expression, Counter(numbers)).parse()


def expression_of(response: str) -> str:
    """The expression a response gives: its last <answer> tag's content, else its last non-empty line, up to an
    `=`; LaTeX dollars, a trailing full stop and the signs ×, ÷, − (as *, /, -) are read too."""
    end = response.rfind("</answer>")
    start = response.rfind("<answer>", 0, end) if end >= 0 else -1
    if start >= 0:
        text = response[start + len("<answer>") : end]
    else:
        lines = [line for line in response.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    for sign, op in _SYNONYMS.items():
        text = text.replace(sign, op)
    return text.split("=", 1)[0].strip().removesuffix(".").strip().strip("$").strip()


def _random_expression(rng: random.Random, numbers: list[int]) -> tuple[int, str]:
    """Combine all `numbers` in a random order with random operators, keeping every value a positive integer."""
    pool = [(n, str(n)) for n in numbers]  # (value, its expression: parenthesised unless a bare number)
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        (a, ea), (b, eb) = sorted((pool[i], pool[j]), key=lambda p: -p[0])
        op = rng.choice(["+", "*"] + (["-"] if a > b else []) + (["/"] if a % b == 0 else []))
        value = {"+": a + b, "*": a * b, "-": a - b, "/": a // b}[op]
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(value, f"({ea} {op} {eb})")]
    value, expression = pool[0]
    return value, expression.removeprefix("(").removesuffix(")")  # the outermost pair only


class CountdownTask(Task):
    name = "countdown"
    params_model = CountdownParams

    def __init__(self, seed: int = 0, params: CountdownParams | None = None):
        self.seed, self.params = seed, params if params is not None else CountdownParams()

    @classmethod
    def from_params(cls, seed: int, params: BaseModel) -> CountdownTask:
        if not isinstance(params, CountdownParams):
            raise TypeError(f"the countdown task is built from CountdownParams, not {type(params).__name__}")
        return cls(seed, params)

    def item(self, index: int) -> TaskItem:
        p, rng = self.params, random.Random(f"countdown:{self.seed}:{index}")
        numbers = [
            rng.randint(p.min_number, p.max_number) for _ in range(rng.randint(p.min_count, p.max_count))
        ]
        for _ in range(_ATTEMPTS):
            target, solution = _random_expression(rng, numbers)
            if 1 <= target <= p.max_target and target not in numbers:  # a given number is no puzzle
                break
        else:  # fits: max_target >= max_count * max_number; above each number: there are two or more
            target, solution = sum(numbers), " + ".join(map(str, numbers))
        return TaskItem(
            id=f"countdown-{self.seed}-{index}",
            prompt=fill_template(p.template, numbers=", ".join(map(str, numbers)), target=target),
            answer=solution,
            kind="custom",  # its own verifier only: the math widening would accept any reply ending in the target
            meta={"numbers": numbers, "target": target},
        )

    def score(self, item: TaskItem, response: str) -> Score:
        expression = expression_of(response)
        try:
            value = evaluate(expression, item.meta["numbers"])
        except Refused as e:
            return Score(0.0, detail=str(e))
        target = item.meta["target"]
        right = value == target
        return Score(float(right), detail=f"{expression} = {value}" + ("" if right else f", not {target}"))
