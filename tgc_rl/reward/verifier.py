"""What a reward worker runs per sample: the task's own verifier, or the job's custom reward function.

Built-in (`task.reward: builtin`): `task.score(item, response)`. For `math` items the verdict is
widened by math-verify: a response that the task's lenient check rejects but that is symbolically
equal to the gold answer (`\\frac12` vs `0.5`) scores 1. Custom (`task.reward: module:function`):
`function(item, response)` returning a float or a `Score`, under the same deadline and accounting.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from tgc_rl.tasks import GrantError, Score, TaskItem, load_task
from tgc_rl.tasks.grants import CUSTOM_CODE, LOCAL_GRANTS
from tgc_rl.tasks.params import TaskParams
from tgc_rl.tasks.registry import import_entry_point

RewardFn = Callable[[TaskItem, str], Any]


class Verifier:
    def __init__(
        self,
        task: str,
        params: TaskParams | Mapping[str, Any],
        seed: int,
        reward: str = "builtin",
        grants: frozenset[str] = LOCAL_GRANTS,
    ):
        self.task = load_task(task, params, seed, grants)
        self.grants = grants
        self._sandboxes: dict[tuple[str, int | None], Any] = {}
        if reward != "builtin" and CUSTOM_CODE not in grants:
            raise GrantError(
                f"task.reward {reward!r}: custom code needs the operator's grant '{CUSTOM_CODE}'"
            )
        self.custom = None if reward == "builtin" else import_reward(reward)

    def __call__(self, item: TaskItem, response: str) -> Score:
        if self.custom is not None:
            return as_score(self.custom(item, response), "task.reward")
        # rows carry their verifier: any worker scores any dataset's items (eval sets)
        if item.kind == "dataset":
            from tgc_rl.tasks.dataset import score_row

            return as_score(score_row(item, response, self.sandbox), "dataset verifier")
        score = as_score(self.task.score(item, response), f"{type(self.task).__name__}.score")
        if item.kind == "math" and item.answer is not None and score.status == "ok" and score.reward < 1.0:
            from tgc_rl.tasks.math_equivalence import verify_math

            widened = verify_math(item.answer, response)
            if widened.reward > score.reward:
                return widened
        return score

    def warm_up(self) -> None:
        """Pay one-time costs (sympy, the sandbox check) before the first deadline starts."""
        if self.custom is not None:
            return
        self.task.warm_up()
        if self.task.item(0).kind == "math":  # the verifier widens math scores with math_equivalence
            from tgc_rl.tasks import math_equivalence

            math_equivalence.warm_up()

    def sandbox(self, mode: str = "bwrap", memory_mb: int | None = None):
        """The code sandbox for dataset rows; an unconfined one only with the operator's grant."""
        from tgc_rl.tasks.grants import UNSAFE_SANDBOX

        if mode != "bwrap" and UNSAFE_SANDBOX not in self.grants:
            raise GrantError(f"sandbox {mode!r} needs the operator's grant '{UNSAFE_SANDBOX}'")
        if (mode, memory_mb) not in self._sandboxes:
            from tgc_rl.tasks.code_tests import make_sandbox

            self._sandboxes[(mode, memory_mb)] = make_sandbox(mode, memory_mb)
        return self._sandboxes[(mode, memory_mb)]


def import_reward(spec: str) -> RewardFn:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"task.reward {spec!r}: use 'builtin' or 'module:function', e.g. 'my_rewards:exact_match'"
        )
    fn = import_entry_point(
        spec,
        "task.reward",
        "make the module importable on the reward workers (PYTHONPATH or an installed package)",
    )
    if not callable(fn):
        raise ValueError(f"task.reward {spec!r}: {attr} is not callable; it must take (item, response)")
    return fn


def as_score(value: Any, source: str) -> Score:
    """A reward function's return value as a Score; anything else is an error, never a silent 0."""
    if isinstance(value, Score):
        reward = value.reward
    elif isinstance(value, numbers.Real):  # float, int, bool, numpy scalars
        reward = float(value)
        value = Score(reward)
    else:
        raise TypeError(f"{source} returned {type(value).__name__}; return a float or a tgc_rl.tasks.Score")
    if not math.isfinite(reward):
        raise ValueError(f"{source} returned a non-finite reward {reward!r}")
    return value
