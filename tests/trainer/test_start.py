"""A job's actors start side by side (reward, learner, rollout); when one part fails to start, the job fails
naming the cause and the parts that did start are stopped (the start-up path has its own error handling)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tgc_rl.trainer.actors import JobActors
from tgc_rl.trainer.main import run

from .conftest import read_events, tiny_spec

# How long a part waits for the others to be starting too. Only reached when they are not: parts started one
# after the other never meet, and the first one's wait ends the start with BrokenBarrierError.
MEET_S = 30.0


class _Parts:
    """Stand-ins for the reward group, rollout pool and learner group: each one's start waits until every
    part is starting at the same time, and records its shutdown."""

    def __init__(self, count: int, failing: str | None = None) -> None:
        self.meet = threading.Barrier(count, timeout=MEET_S)
        self.failing = failing
        self.stopped: list[str] = []
        self.loaded: list[Path] = []
        parts = self

        class Part:
            def __init__(self, kind: str) -> None:
                self.kind = kind
                try:
                    parts.meet.wait()
                except threading.BrokenBarrierError:
                    raise AssertionError(
                        f"{kind} waited {MEET_S} s for the other parts to be starting"
                    ) from None
                if kind == parts.failing:
                    raise RuntimeError(f"{kind} could not start")

            def shutdown(self) -> None:
                parts.stopped.append(self.kind)

        class Rewards(Part):
            @classmethod
            def for_job(cls, task, seed, job_name) -> Rewards:
                return cls("rewards")

        class Rollout(Part):
            def __init__(self, spec, model_path, name) -> None:
                super().__init__("rollout")

        class Learner(Part):
            def __init__(self, spec, model_path, name) -> None:
                super().__init__("learner")

            def load(self, path: Path) -> None:
                parts.loaded.append(path)

        self.rewards, self.rollout, self.learner = Rewards, Rollout, Learner

    def install(self, monkeypatch) -> None:
        import tgc_rl.learner
        import tgc_rl.reward
        import tgc_rl.rollout

        monkeypatch.setattr(tgc_rl.reward, "RewardPoolGroup", self.rewards)
        monkeypatch.setattr(tgc_rl.rollout, "RolloutPool", self.rollout)
        monkeypatch.setattr(tgc_rl.learner, "LearnerGroup", self.learner)


@pytest.mark.parametrize("learner", [True, False], ids=["training", "eval-only"])
def test_the_parts_are_all_starting_at_the_same_time(monkeypatch, tmp_path, learner):
    parts = _Parts(3 if learner else 2)
    parts.install(monkeypatch)
    actors = JobActors.start(tiny_spec(), tmp_path, learner=learner, resume=tmp_path / "step_2")
    assert (actors.rewards.kind, actors.rollout.kind) == ("rewards", "rollout")
    if learner:
        assert actors.learner is not None and actors.learner.kind == "learner"
        assert parts.loaded == [tmp_path / "step_2"]  # the learner loads the checkpoint as part of its start
    else:
        assert actors.learner is None and parts.loaded == []
    actors.stop()
    assert parts.stopped == (["rollout", "learner", "rewards"] if learner else ["rollout", "rewards"])


def test_a_failed_part_stops_the_parts_that_started_beside_it(monkeypatch, tmp_path):
    parts = _Parts(3, failing="rollout")
    parts.install(monkeypatch)
    with pytest.raises(RuntimeError, match="rollout could not start"):
        JobActors.start(tiny_spec(), tmp_path)
    assert parts.stopped == ["learner", "rewards"]


@pytest.mark.slow
def test_a_rollout_that_fails_to_start_leaves_no_learner_or_reward_actor(ray_cluster, tmp_path, monkeypatch):
    import tgc_rl.rollout

    def broken_pool(*args, **kwargs):
        raise RuntimeError("replica could not load its weights")

    monkeypatch.setattr(tgc_rl.rollout, "RolloutPool", broken_pool)
    assert run(tiny_spec(name="halfstart"), tmp_path) == "failed"
    final = [e for e in read_events(tmp_path) if e["type"] == "state"][-1]
    assert "replica could not load its weights" in final["reason"]
    # the learner ranks and the reward actor started beside the rollout and are gone again
    alive = [a["name"] for a in ray_cluster.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in alive if n.startswith("halfstart")], alive
