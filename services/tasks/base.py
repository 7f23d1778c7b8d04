"""The task interface: a deterministic stream of TaskItems and a verifier for responses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ScoreStatus = Literal["ok", "timeout", "error"]


@dataclass(frozen=True)
class TaskItem:
    """One prompt. `kind` tells the reward side which verifier runs it."""

    id: str
    prompt: str
    answer: str | None = None
    kind: Literal["math", "code", "custom", "gym", "dataset"] = "math"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Score:
    reward: float
    status: ScoreStatus = "ok"
    detail: str = ""


class Task(Protocol):
    name: str

    def item(self, index: int) -> TaskItem:
        """The index-th item of the stream; the same index always gives the same item."""

    def score(self, item: TaskItem, response: str) -> Score:
        """Verify one response in-process (the reward pool runs this under a deadline)."""


class GrantError(PermissionError):
    """The spec needs a privilege that the operator did not grant to this job."""
