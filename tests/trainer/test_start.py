"""A job's actors start side by side (reward, learner, rollout); when one part fails to start, the job fails
naming the cause and the parts that did start are stopped (the start-up path has its own error handling)."""

import pytest

from tgc_rl.trainer.main import run

from .conftest import read_events, tiny_spec

pytestmark = pytest.mark.slow


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
