"""What a step samples: groups of completions of one prompt with their scores, and the rollout that carries
them to the learner (the loop, the credit schemes and the multi-turn sampler all speak these)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tgc_rl.batch import Completion
from tgc_rl.tasks import Score
from tgc_rl.trainer.data import Prompt


@dataclass
class Group:
    prompt: Prompt
    completions: list[Completion]
    scores: list[Score]
    # the credit scheme's own record of the group (tgc_rl/trainer/credit.py; IBPO: its revisions)
    credit: object | None = None
    keep: list[bool] | None = None  # multi-turn: the trajectories that enter the centring (None: all)

    @property
    def kept(self) -> list[bool]:
        """One flag per completion: does it enter the centring (every one, unless a trajectory failed)."""
        return self.keep or [True] * len(self.completions)

    @property
    def informative(self) -> bool:
        return len({s.reward for s in self.scores}) > 1


@dataclass
class Rollout:
    groups: list[Group]
    end_position: int  # data position after this rollout's prompts: what a checkpoint resumes from
    metrics: dict[str, float] = field(default_factory=dict)
