"""Built-in arithmetic task: small-operand +/- questions a 135M chat model partly solves."""

from __future__ import annotations

import random

from tgc_rl.tasks.answers import last_number
from tgc_rl.tasks.base import Score, Task, TaskItem
from tgc_rl.tasks.params import fill_template

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticTask(Task):
    name = "arithmetic"

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
