"""A job's actors, one lifecycle for training and eval-only runs: the reward actor, the rollout replicas and
(when training) the learner ranks start side by side, and stop in one order, each stop attempted even when
another fails (leaving actors behind is worse than a noisy teardown)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tgc_rl.config import JobSpec
from tgc_rl.rollout import RolloutSpec, engine_kind

if TYPE_CHECKING:
    from tgc_rl.learner import LearnerGroup
    from tgc_rl.reward import RewardPoolGroup
    from tgc_rl.rollout import RolloutPool

log = logging.getLogger("tgc.trainer")


class _Stoppable(Protocol):
    def shutdown(self) -> None: ...


@dataclass
class JobActors:
    rewards: RewardPoolGroup
    rollout: RolloutPool
    learner: LearnerGroup | None = None

    @classmethod
    def start(
        cls, spec: JobSpec, model_path: Path, *, learner: bool = True, resume: Path | None = None
    ) -> JobActors:
        """Start the job's actors; `resume`: a checkpoint the learner loads. A failed start stops the parts
        that did start and raises the first error."""
        from tgc_rl.learner import LearnerGroup
        from tgc_rl.reward import RewardPoolGroup
        from tgc_rl.rollout import RolloutPool

        engine_kind(RolloutSpec.of(spec))  # an engine that cannot be built or receive a broadcast fails here

        def start_learner() -> LearnerGroup:
            group = LearnerGroup(spec, model_path, spec.name)
            if resume is not None:
                group.load(resume)
            return group

        # Side by side: each part spends its start-up importing, loading weights and (vLLM) warming its
        # engine, and none needs another until the first step.
        with ThreadPoolExecutor(3, thread_name_prefix="start") as pool:
            rewards = pool.submit(RewardPoolGroup.for_job, spec.task, spec.seed, spec.name)
            rollout = pool.submit(RolloutPool, spec, model_path, spec.name)
            ranks = pool.submit(start_learner) if learner else None
        futures = [f for f in (rollout, ranks, rewards) if f is not None]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            stop(*(f.result() for f in futures if f.exception() is None))
            raise errors[0]
        return cls(rewards.result(), rollout.result(), ranks.result() if ranks is not None else None)

    def stop(self) -> None:
        stop(self.rollout, self.learner, self.rewards)


def stop(*parts: _Stoppable | None) -> None:
    """Shut each part down in order, going on past a failure."""
    for part in parts:
        if part is None:
            continue
        try:
            part.shutdown()
        except Exception as e:
            log.warning("shutdown of %s failed: %s", type(part).__name__, e)
