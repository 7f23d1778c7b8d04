"""Built-in arithmetic task: small-operand +/- questions a 135M chat model partly solves."""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field, field_validator

from tgc_rl.tasks.answers import last_number
from tgc_rl.tasks.base import Score, Task, TaskItem
from tgc_rl.tasks.params import MAX_TEMPLATE_CHARS, TaskParams, check_template, fill_template

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticParams(TaskParams):
    max_operand: int = Field(9, ge=0, le=10**9, description="Largest operand.")
    min_operand: int = Field(0, ge=0, le=10**9, description="Smallest operand (<= max_operand).")
    ops: list[Literal["+", "-", "*"]] = Field(["+"], min_length=1, max_length=3, description="Operators.")
    template: str = Field(
        "What is {a} {op} {b}? Reply with just the number.",
        min_length=1,
        max_length=MAX_TEMPLATE_CHARS,
        description="Question; slots {a}, {op}, {b}.",
    )

    @field_validator("template")
    @classmethod
    def _slots(cls, v: str) -> str:
        check_template(v, ("a", "op", "b"))
        return v

    @field_validator("min_operand")
    @classmethod
    def _ordered(cls, v: int, info) -> int:
        if "max_operand" in info.data and v > info.data["max_operand"]:
            raise ValueError("need min_operand <= max_operand")
        return v


class ArithmeticTask(Task):
    name = "arithmetic"
    params_model = ArithmeticParams

    def __init__(
        self,
        seed: int = 0,
        max_operand: int = 9,
        ops: tuple[str, ...] | list[str] = ("+",),
        min_operand: int = 0,
        template: str = "What is {a} {op} {b}? Reply with just the number.",
    ):
        bad = [op for op in ops if op not in _OPS]
        if bad or not ops:
            raise ValueError(f"task.params.ops {list(ops)!r}: allowed operators are {sorted(_OPS)}")
        if not 0 <= min_operand <= max_operand:
            raise ValueError("task.params: need 0 <= min_operand <= max_operand")
        self.seed, self.max_operand, self.min_operand = seed, max_operand, min_operand
        self.ops, self.template = tuple(ops), template

    def item(self, index: int) -> TaskItem:
        rng = random.Random(f"{self.seed}:{index}")
        a = rng.randint(self.min_operand, self.max_operand)
        b = rng.randint(self.min_operand, self.max_operand)
        op = rng.choice(self.ops)
        return TaskItem(
            id=f"arith-{self.seed}-{index}",
            prompt=fill_template(self.template, a=a, op=op, b=b),
            answer=str(_OPS[op](a, b)),
            kind="math",
        )

    def score(self, item: TaskItem, response: str) -> Score:
        got = last_number(response)
        return Score(reward=float(got is not None and got == item.answer))
