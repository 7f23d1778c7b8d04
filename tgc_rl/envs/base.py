"""The environment contract: what a multi-turn job's environment is, says and may do.

An environment is built once per trajectory from a task item (`EnvContext`). `reset()` gives the first
observation: the chat messages the model answers first. `step(model_text)` takes the text of one model turn
and gives a `StepResult`: the next observation (None once done), a reward, done, and typed info. Tools are
what an environment executes inside `step`; each tool call first asks the context for its budget
(`EnvContext.start_tool_call`), which ends the trajectory at a bound instead of running the call.

The rewards of a trajectory's steps add up to its one reward: credit is per trajectory (issue 30), never
per turn. Token bookkeeping is not the environment's business (tgc_rl.envs.tokens).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tgc_rl.envs.bounds import EnvBounds
from tgc_rl.tasks import Score, TaskItem

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
# Why a trajectory ended. `done`: the environment said so; the rest are bounds or failures (see rollout.py).
EndReason = Literal[
    "done", "max_turns", "max_tool_calls", "deadline", "max_total_tokens", "bridge", "env_error"
]


@dataclass(frozen=True)
class Message:
    """One chat message, as the chat template renders it."""

    role: Role
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"message role {self.role!r}: use one of {', '.join(ROLES)}")
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be a str, not {type(self.content).__name__}")

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class StepInfo:
    """What one step's tools did (the context counts the calls themselves), and a note for traces."""

    tool_errors: int = 0  # calls that ran and failed (a parse error, a non-zero exit)
    tool_timeouts: int = 0  # calls killed at their deadline
    detail: str = ""


@dataclass(frozen=True)
class StepResult:
    """The answer to one model turn. A step that is not done must give the model something to answer."""

    observation: tuple[Message, ...] | None
    reward: float = 0.0
    done: bool = False
    info: StepInfo = field(default_factory=StepInfo)

    def __post_init__(self) -> None:
        if self.observation is not None and not isinstance(self.observation, tuple):
            object.__setattr__(self, "observation", tuple(self.observation))  # a list is fine to pass
        if not (isinstance(self.reward, int | float) and math.isfinite(self.reward)):
            raise ValueError(f"StepResult.reward={self.reward!r}: must be a finite number")
        if not self.done and not self.observation:
            raise ValueError("StepResult: a step that is not done needs a non-empty observation")
        if self.done and self.observation:
            raise ValueError("StepResult: a done step has no observation (the model will not answer it)")
        if self.observation and any(m.role == "assistant" for m in self.observation):
            # the model's own turns come from the engine as sampled; an environment never writes them
            raise ValueError("StepResult.observation: an environment may not write assistant messages")


class BoundHit(Exception):
    """Raised out of `step` when a bound ends the trajectory (the runner records `reason`)."""

    def __init__(self, reason: EndReason, detail: str):
        super().__init__(detail)
        self.reason: EndReason = reason
        self.detail = detail


@dataclass
class EnvContext:
    """What an environment gets for its one trajectory: the task item, its verifier, the bounds, a deadline.

    `verify` scores a final answer with the job's task verifier (for the item). `deadline` is on the
    `clock` (monotonic seconds) and ends the whole trajectory; each tool call gets
    min(tool_timeout_s, time left) from `start_tool_call`.
    """

    item: TaskItem
    verify: Callable[[str], Score]
    bounds: EnvBounds
    clock: Callable[[], float] = time.monotonic
    deadline: float = 0.0  # 0: set from bounds.deadline_s when the context is made
    tool_calls: int = 0

    def __post_init__(self) -> None:
        if not self.deadline:
            self.deadline = self.clock() + self.bounds.deadline_s

    def time_left(self) -> float:
        return self.deadline - self.clock()

    def start_tool_call(self) -> float:
        """Count one tool call and return its timeout in seconds; raise BoundHit instead when the call
        would pass max_tool_calls or the trajectory's deadline has passed."""
        if self.tool_calls >= self.bounds.max_tool_calls:
            raise BoundHit("max_tool_calls", f"a tool call past max_tool_calls={self.bounds.max_tool_calls}")
        left = self.time_left()
        if left <= 0:
            raise BoundHit("deadline", f"a tool call after the deadline ({self.bounds.deadline_s} s)")
        self.tool_calls += 1
        return min(self.bounds.tool_timeout_s, left)


class Environment(Protocol):
    """A multi-turn environment (one instance per trajectory). See docs/multi_turn.md."""

    def reset(self) -> list[Message]:
        """The first observation: the messages the model answers first (a system and/or user message)."""

    def step(self, model_text: str) -> StepResult:
        """The next observation for one model turn's text, its reward, and whether the trajectory is done."""

    def close(self) -> None:
        """Release what the environment holds (processes, files); called once, however it ended."""


EnvFactory = Callable[[EnvContext, dict[str, Any]], Environment]
