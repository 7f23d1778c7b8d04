"""Credit assignment of a step: how sampled, scored groups become the advantages the learner trains on.

The loop holds one `Credit` and knows no scheme. `ObjectiveCredit` is the objective's own advantages (with
`sampling.overlong` applied before centring); IBPO (tgc_rl/trainer/ibpo.py) revises a step's incorrect
responses first and shapes the rewards. A new scheme implements the protocol and adds a case to
`credit_for`; what it keeps per group goes in `Group.credit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

import rlcore
from rlcore.advantages import Shaping, overlong_penalty, overlong_shaping
from tgc_rl.batch import Completion, SampledBatch, TrainBatch
from tgc_rl.config import JobSpec, SamplingSpec
from tgc_rl.run_layout import OVERLONG_DROPPED_GROUPS, OVERLONG_FRAC
from tgc_rl.trainer.groups import Group

if TYPE_CHECKING:
    from tgc_rl.reward import RewardPoolGroup
    from tgc_rl.rollout import RolloutPool


class Credit(Protocol):
    preserves: bool  # whether the step keeps token-gradient cancellation (held against each step's D2)

    def after_rollout(
        self, groups: list[Group], rollout: RolloutPool, rewards: RewardPoolGroup, metrics: dict[str, float]
    ) -> None:
        """Work on the step's groups with the weights that sampled them (before any update); adds metrics."""

    def train_batch(self, groups: list[Group], sampled: SampledBatch) -> tuple[TrainBatch, dict[str, float]]:
        """The batch trained on (advantages, optionally a credit mask) and the metrics of making it."""


class ObjectiveCredit:
    """The objective's advantages of the rewards, `sampling.overlong` applied before centring."""

    def __init__(self, objective: rlcore.Objective, sampling: SamplingSpec):
        self.objective, self.sampling = objective, sampling
        self.preserves = objective.preserves_cancellation

    def after_rollout(
        self, groups: list[Group], rollout: RolloutPool, rewards: RewardPoolGroup, metrics: dict[str, float]
    ) -> None:
        return None

    def train_batch(self, groups: list[Group], sampled: SampledBatch) -> tuple[TrainBatch, dict[str, float]]:
        comps = [c for g in groups for c in g.completions]
        gids = [i for i, g in enumerate(groups) for _ in g.completions]
        keep = [k for g in groups for k in g.kept]
        shaping, keep, metrics = overlong_handling(self.sampling, comps, gids, keep)
        kept = None if all(keep) else torch.tensor(keep)  # failed or truncated: filtered before centring
        adv = self.objective.advantages(
            sampled.rewards, sampled.group_ids, sampled.response_mask, shaping=shaping, keep=kept
        )
        return sampled.with_advantages(adv), metrics


def credit_for(spec: JobSpec, tokenizer: Any, objective: rlcore.Objective) -> Credit:
    """The job's credit scheme: IBPO when its section is on, else the objective's own."""
    if spec.ibpo is not None and spec.ibpo.enabled:
        from tgc_rl.trainer.ibpo import Reviser

        return Reviser(spec, tokenizer, objective)
    return ObjectiveCredit(objective, spec.sampling)


def overlong_handling(
    sampling: SamplingSpec, comps: list[Completion], gids: list[int], keep: list[bool]
) -> tuple[Shaping | None, list[bool], dict[str, float]]:
    """`sampling.overlong` as inputs of the advantages, both applied before centring so each group still sums
    to 0 (cancellation holds): (the reward shaping, the responses kept, the metrics); no metrics when off."""
    spec = sampling.overlong
    if spec.mode == "none":
        return None, keep, {}
    if spec.mode == "shape":
        if spec.buffer is None:  # the spec refuses mode 'shape' without one
            raise ValueError("sampling.overlong.buffer: required with mode 'shape'")
        lengths = torch.tensor([len(c.token_ids) for c in comps])
        penalty = overlong_penalty(lengths, sampling.max_new_tokens, spec.buffer, spec.factor)
        shaping = overlong_shaping(lengths, sampling.max_new_tokens, spec.buffer, spec.factor)
        return shaping, keep, {OVERLONG_FRAC: float((penalty < 0).float().mean())}
    cut = [c.finish_reason == "length" for c in comps]
    kept = [k and not t for k, t in zip(keep, cut, strict=True)]
    live: dict[int, int] = {}
    for g, k in zip(gids, kept, strict=True):
        live[g] = live.get(g, 0) + k
    dropped = sum(n < 2 for n in live.values())  # rlcore zeroes a group with < 2 kept: no gradient from it
    return None, kept, {OVERLONG_FRAC: sum(cut) / max(len(cut), 1), OVERLONG_DROPPED_GROUPS: float(dropped)}
