"""The `python_tool` environment: tool-integrated reasoning with a Python interpreter in the sandbox.

The model calls the tool by writing a fenced block, ```python ... ``` (also ```py / ```python3); every
closed block of a turn runs, in order, as one cell. A turn without a block is the final answer, scored by
the task's verifier (the math verifier for math items).

Notebook semantics: each cell runs in a fresh bubblewrap sandbox process (tgc_rl.sandbox, the code
rewards' limits) after a silent re-run of the trajectory's earlier cells in one shared namespace, so
names defined earlier exist; the earlier cells' output is discarded and their errors are ignored. Side
effects and randomness are re-done each time (no state survives between processes), and the re-run
counts against the call's time limit. The cell's stdout and stderr, cut to `max_output_chars` with a
marker, come back as a tool message. A cell that does not finish within the per-call timeout is killed
at the process level (the sandbox's pid namespace goes with it).
"""

from __future__ import annotations

import functools
import math
import re

from pydantic import BaseModel, ConfigDict, Field

from tgc_rl.envs.base import EnvContext, Message, StepInfo, StepResult
from tgc_rl.sandbox import RunResult, Sandbox, SandboxLimits
from tgc_rl.tasks.grants import UNSAFE_SANDBOX

_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)```", re.S)
_TRUNCATED = "\n...[truncated {n} characters]"

# One program per cell: earlier cells re-run silently in one namespace, then the new cell. Model code runs
# only inside the sandbox, where `exec` is how a notebook runs a cell.
_NOTEBOOK = """\
import contextlib as _c, io as _io
_g = {{"__name__": "__main__"}}
for _n, _src in enumerate({earlier!r}, 1):
    with _c.redirect_stdout(_io.StringIO()), _c.redirect_stderr(_io.StringIO()):
        try:
            exec(compile(_src, "<cell %d>" % _n, "exec"), _g)
        except BaseException:
            pass
exec(compile({cell!r}, "<cell {number}>", "exec"), _g)
"""


class PythonToolParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    sandbox: str = Field(
        "bwrap",
        pattern="^(bwrap|unsafe_local)$",
        description="`bwrap` (default), or `unsafe_local` (no isolation: needs the operator's grant).",
        json_schema_extra={"privilege": UNSAFE_SANDBOX},
    )
    memory_mb: int = Field(512, ge=64, le=4096, description="Address-space limit of the cell's process.")
    max_output_chars: int = Field(
        2000, ge=64, le=65536, description="Characters of stdout + stderr returned; more is cut, marked."
    )
    system_prompt: str | None = Field(
        None, max_length=8192, description="A system message placed before the task's prompt."
    )


@functools.cache
def _sandbox(mode: str) -> Sandbox:
    # one per process: a Sandbox checks once that bwrap works here, then runs are independent
    return Sandbox(SandboxLimits(), mode=mode)  # type: ignore[arg-type]


def cells_of(model_text: str) -> list[str]:
    """The closed ```python blocks of one model turn."""
    return _BLOCK.findall(model_text)


def program(earlier: list[str], cell: str) -> str:
    return _NOTEBOOK.format(earlier=tuple(earlier), cell=cell, number=len(earlier) + 1)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + _TRUNCATED.format(n=len(text) - limit)


def tool_output(result: RunResult, timeout_s: float, limit: int) -> str:
    out = result.stdout + (("\n" if result.stdout and result.stderr else "") + result.stderr)
    if result.status == "timeout":
        out += f"\n[killed: the cell ran past its {timeout_s:g} s limit]"
    elif result.status == "output_limit":
        out += "\n[killed: the cell wrote too much output]"
    return truncate(out, limit) if out.strip() else "[no output]"


class PythonToolEnv:
    def __init__(self, ctx: EnvContext, params: PythonToolParams):
        self.ctx, self.params = ctx, params
        self.cells: list[str] = []

    def reset(self) -> list[Message]:
        first = [Message("system", self.params.system_prompt)] if self.params.system_prompt else []
        return [*first, Message("user", self.ctx.item.prompt)]

    def step(self, model_text: str) -> StepResult:
        blocks = cells_of(model_text)
        if not blocks:
            score = self.ctx.verify(model_text)
            return StepResult(None, score.reward, True, StepInfo(detail=score.detail))
        timeout = self.ctx.start_tool_call()  # raises at max_tool_calls or past the deadline
        cell = "\n".join(blocks)
        limits = SandboxLimits().replace(
            wall_s=timeout, cpu_s=max(1, math.ceil(timeout)), memory_mb=self.params.memory_mb
        )
        result = _sandbox(self.params.sandbox).run(program(self.cells, cell), limits=limits)
        self.cells.append(cell)
        text = tool_output(result, timeout, self.params.max_output_chars)
        info = StepInfo(
            tool_errors=int(result.status == "finished" and result.exit_code != 0),
            tool_timeouts=int(result.status == "timeout"),
            detail=result.status,
        )
        return StepResult((Message("tool", text),), info=info)

    def close(self) -> None:
        pass
