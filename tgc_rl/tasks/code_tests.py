"""Code answers: take the program out of a response and run the item's tests on it in the sandbox.

Two test styles, carried in `TaskItem.meta["tests"]` (see `CodeTests`): `stdio` cases (stdin in,
expected stdout out; one sandboxed run per case) and `function` tests (assert statements, or a
HumanEval `check(candidate)`, run once after the program). A wrong, crashing, looping or too chatty
program is a verdict (status ok, reward 0, the reason in `detail`); a sandbox that cannot run is an
exception, which the reward pool turns into status `error`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from tgc_rl.tasks.base import Score, Task, TaskItem

if TYPE_CHECKING:  # the sandbox is imported where a response is scored: a task's params model never needs it
    from tgc_rl.sandbox import RunResult, Sandbox

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = ("python", "python3", "py", "")


def extract_program(response: str) -> str:
    """The last ```python block (an unterminated one counts: the response may be cut off); without
    any fenced block, the response itself."""
    blocks = [body for lang, body in _FENCE.findall(response) if lang.lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else response


@dataclass(frozen=True)
class CodeTests:
    """The tests of one code item."""

    style: Literal["stdio", "function"]
    cases: tuple[tuple[str, str], ...] = ()  # stdio: (stdin, expected stdout)
    entry_point: str = ""  # function: the name the tests call
    test: str = ""  # function: test code run after the program (asserts, or `def check(candidate)`)
    call_check: bool = False  # function: then call `check(<entry_point>)` (HumanEval)
    prompt: str = ""  # function: code the model was asked to complete (HumanEval prompt)
    timeout_s: float = 5.0  # wall-clock limit of one sandboxed run

    def __post_init__(self) -> None:
        if self.style not in ("stdio", "function"):
            raise ValueError(f"tests.style {self.style!r}: use 'stdio' or 'function'")
        if self.style == "stdio" and not self.cases:
            raise ValueError("tests.cases: a stdio test needs at least one (stdin, stdout) case")
        if self.style == "function" and (not self.entry_point.isidentifier() or not self.test.strip()):
            raise ValueError(
                "tests: a function test needs an identifier `entry_point` and non-empty `test` code"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"tests.timeout_s={self.timeout_s!r}: must be a positive number of seconds")

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> CodeTests:
        raw = meta.get("tests")
        if not isinstance(raw, dict):
            raise ValueError("item.meta['tests'] is missing; a code item needs its tests (see CodeTests)")
        data = dict(raw)
        data["cases"] = tuple((str(i), str(o)) for i, o in data.get("cases", ()))
        try:
            return cls(**data)
        except TypeError as e:
            raise ValueError(f"item.meta['tests']: {e}") from None

    def to_meta(self) -> dict[str, Any]:
        data = asdict(self)
        data["cases"] = [list(c) for c in self.cases]
        return data


def function_program(tests: CodeTests, code: str) -> str:
    """The program for function tests: the response's code (after the prompt it completes), then the tests."""
    defines = re.search(rf"^\s*(async\s+)?def\s+{re.escape(tests.entry_point)}\s*\(", code, re.M)
    if tests.prompt and not defines:
        program = tests.prompt + code  # a body completion of the prompt's function
    else:
        program = (tests.prompt + "\n\n" if tests.prompt else "") + code  # a whole definition; the prompt's
        # helpers and imports stay available, and the later definition wins
    program += "\n\n" + tests.test + "\n"
    if tests.call_check:
        program += f"\ncheck({tests.entry_point})\n"
    return program


def score_code(sandbox: Sandbox, tests: CodeTests, response: str, partial_credit: bool = False) -> Score:
    code = extract_program(response)
    limits = sandbox.limits.replace(wall_s=tests.timeout_s, cpu_s=max(1, math.ceil(tests.timeout_s)))
    if tests.style == "function":
        result = sandbox.run(function_program(tests, code), limits=limits)
        if result.ok:
            return Score(1.0, detail="tests passed")
        return Score(0.0, detail=f"tests failed: {_failure(result)}")
    passed = 0
    first_failure = ""
    for i, (stdin, expected) in enumerate(tests.cases, 1):
        result = sandbox.run(code, stdin=stdin, limits=limits)
        if result.ok and _normalise(result.stdout) == _normalise(expected):
            passed += 1
            continue
        if not first_failure:
            why = "wrong output" if result.ok else _failure(result)
            first_failure = f"case {i}/{len(tests.cases)}: {why}"
        if not partial_credit:
            break
    n = len(tests.cases)
    if passed == n:
        return Score(1.0, detail=f"{n}/{n} cases passed")
    reward = passed / n if partial_credit else 0.0
    return Score(reward, detail=f"{passed}/{n} cases passed; {first_failure}")


def _normalise(text: str) -> str:
    """Compare outputs line by line, ignoring trailing spaces and trailing blank lines."""
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).strip("\n")


def _failure(result: RunResult) -> str:
    if result.status == "timeout":
        return f"timed out after {result.wall_s:.1f}s"
    if result.status == "output_limit":
        return "output too large"
    tail = result.stderr.strip().splitlines()[-1:] or [""]
    if result.signal is not None:
        return f"killed by signal {result.signal} {tail[0]}".strip()
    return f"exit code {result.exit_code}: {tail[0][:300]}".rstrip(": ")


def make_sandbox(mode: str = "bwrap", memory_mb: int | None = None) -> Sandbox:
    """The sandbox of a code task, from its `task.params` (`sandbox`, `memory_mb`)."""
    if mode not in ("bwrap", "unsafe_local"):
        raise ValueError(
            f"task.params.sandbox {mode!r}: use 'bwrap' (default) or 'unsafe_local' (trusted code only)"
        )
    from tgc_rl.sandbox import Sandbox

    sandbox = Sandbox(mode=mode)  # type: ignore[arg-type]
    if memory_mb is not None:
        sandbox.limits = sandbox.limits.replace(memory_mb=memory_mb)
    return sandbox


class SandboxedCodeTask(Task):
    """What every code task shares: its sandbox (built on first use, in the reward worker, so that prompt-only
    users need no bwrap), scoring a response against the item's tests, and paying the sandbox check up front.
    Subclasses set `sandbox_mode`, `memory_mb` and `partial_credit`."""

    sandbox_mode: str = "bwrap"
    memory_mb: int | None = None
    partial_credit: bool = False
    _sandbox: Sandbox | None = None

    def score(self, item: TaskItem, response: str) -> Score:
        return score_code(self.sandbox(), CodeTests.from_meta(item.meta), response, self.partial_credit)

    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = make_sandbox(self.sandbox_mode, self.memory_mb)
        return self._sandbox

    def warm_up(self) -> None:
        self.sandbox()
