"""The task contract: a deterministic stream of TaskItems and a verifier for responses, plus the optional
capabilities a task may have, each declared here with the default that a task without it gets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from typing import Self

    from pydantic import BaseModel

    from tgc_rl.tasks.params import TaskParams

ScoreStatus = Literal["ok", "timeout", "error"]
# A response whose reward reaches this is correct: `reward/accuracy`, `eval/accuracy` and IBPO's verdicts
# all count with it (rewards in [0, 1]; partial credit stays below it).
CORRECT_REWARD = 1.0


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

    @property
    def correct(self) -> bool:
        return self.reward >= CORRECT_REWARD


class Task:
    """What the trainer, the evaluation and the reward workers ask of a task.

    A task implements `name`, `item` and `score`; the other methods are optional capabilities whose defaults
    here describe an endless generated stream. Built-in tasks subclass this; a custom `module:function`
    factory may return any object with `name`, `item` and `score` (load_task gives it these defaults).
    """

    name: str
    # A built-in task's declared `task.params`, defined in its own module next to the class; the registry
    # reads it from there, and that module keeps its heavy imports inside functions, so that the control plane
    # and `tgc schema` import it for this model alone.
    params_model: ClassVar[type[TaskParams]]

    @classmethod
    def from_params(cls, seed: int, params: BaseModel) -> Self:
        """The task for the job seed and its validated `task.params` (an instance of `params_model`), as
        load_task builds a built-in task."""
        return cls(seed=seed, **params.model_dump(exclude_unset=True))  # type: ignore[call-arg]

    def item(self, index: int) -> TaskItem:
        """The index-th item of the stream; the same index always gives the same item."""
        raise NotImplementedError

    def score(self, item: TaskItem, response: str) -> Score:
        """Verify one response in-process (the reward pool runs this under a deadline)."""
        raise NotImplementedError

    def epoch_size(self) -> int | None:
        """Items in one pass over a finite data set, whose passes the job counts as data epochs
        (`data/epoch`); None: a generated or cycling stream, which has no data epochs."""
        return None

    def distinct_items(self) -> int | None:
        """How many different items the stream holds before it repeats, where that is a fixed, small number
        (`tgc data export` writes each once); None: practically unbounded."""
        return None

    def available(self, index: int) -> bool:
        """Whether `item(index)` exists: a stream with a set number of passes runs out."""
        return True

    def filter_prompts(self, fits: Callable[[TaskItem], bool]) -> int:
        """Drop the items that `fits` refuses (longer than the prompt limit) before the first one is drawn;
        returns how many were dropped. A task that cannot drop items keeps them: too long is then an error."""
        return 0

    def warm_up(self) -> None:
        """Pay one-time costs (a sandbox check, a parser's import) before the reward deadline starts."""
