"""RewardPoolActor on a real local Ray cluster: object-store results, names, back-pressure, no leftovers."""

import time

import pytest

from tests.proc_helpers import alive, wait_until
from tests.reward.reward_fixtures import HANGING_MATH
from tgc_rl.config import TaskSpec
from tgc_rl.tasks import TaskItem, load_task

pytestmark = pytest.mark.slow

JUDGE = "tests.reward.reward_fixtures:judge"


@pytest.fixture(scope="module")
def actor(ray_cluster):
    from tgc_rl.reward import start_reward_pool_actor

    spec = TaskSpec(name="arithmetic", reward_workers=2, reward_timeout_s=3.0)
    handle = start_reward_pool_actor(spec, seed=0, name="tgc-reward-test", num_cpus=0.5)
    yield handle
    ray_cluster.get(handle.close.remote())
    ray_cluster.kill(handle)


def test_scores_come_back_through_the_object_store(ray_cluster, actor):
    task = load_task("arithmetic", {}, 0)
    items = [task.item(i) for i in range(8)]
    responses = [it.answer if i % 2 else "nope" for i, it in enumerate(items)]
    ref = actor.score.remote(ray_cluster.put(items), responses)
    assert isinstance(ref, ray_cluster.ObjectRef)
    scores = ray_cluster.get(ref)
    assert [s.reward for s in scores] == [float(i % 2) for i in range(8)]


def test_the_actor_is_found_by_its_name(ray_cluster, actor):
    same = ray_cluster.get_actor("tgc-reward-test")
    item = TaskItem(id="x", prompt="?", answer="4", kind="math")
    assert ray_cluster.get(same.score.remote([item], ["4"]))[0].reward == 1.0


def test_timeouts_are_reported_through_the_actor(ray_cluster, actor):
    ray_cluster.get(actor.stats.remote())
    item = TaskItem(id="x", prompt="?", answer=HANGING_MATH[0], kind="math")
    score = ray_cluster.get(actor.score.remote([item], [HANGING_MATH[1]]))[0]
    assert score.status == "timeout"
    assert ray_cluster.get(actor.stats.remote())["reward/timeouts"] == 1.0


def _call_once_admitted(handle, items, responses, timeout_s: float = 10.0):
    """Ray's caller-side pending-call count can lag `ray.get` of the previous call by a moment: retry."""
    from ray.exceptions import PendingCallsLimitExceeded

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return handle.score.remote(items, responses)
        except PendingCallsLimitExceeded:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_calls_beyond_max_pending_are_refused(ray_cluster):
    from ray.exceptions import PendingCallsLimitExceeded

    from tgc_rl.reward import start_reward_pool_actor

    spec = TaskSpec(name="arithmetic", reward=JUDGE, reward_workers=1, reward_timeout_s=10.0)
    handle = start_reward_pool_actor(spec, num_cpus=0.5, max_concurrency=1, max_pending_calls=1)
    item = TaskItem(id="x", prompt="?", answer="1", kind="math")
    try:
        first = _call_once_admitted(handle, [item], ["slow"])
        with pytest.raises(PendingCallsLimitExceeded):
            handle.score.remote([item], ["1"])
        assert ray_cluster.get(first)[0].reward == 1.0
        assert ray_cluster.get(_call_once_admitted(handle, [item], ["1"]))[0].reward == 1.0
    finally:
        ray_cluster.kill(handle)


def test_killing_the_actor_leaves_no_worker_process(ray_cluster):
    from tgc_rl.reward import start_reward_pool_actor

    spec = TaskSpec(name="arithmetic", reward=JUDGE, reward_workers=2)
    handle = start_reward_pool_actor(spec, num_cpus=0.5)
    pids = ray_cluster.get(handle.worker_pids.remote())
    assert len(pids) == 2 and all(alive(p) for p in pids)
    ray_cluster.kill(handle)  # no close(): the workers must still go with their parent
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=30)


def test_a_group_splits_a_batch_over_its_actors_and_keeps_order(ray_cluster):
    from tgc_rl.reward import RewardPoolGroup

    spec = TaskSpec(name="arithmetic", reward=JUDGE, reward_workers=1)
    group = RewardPoolGroup(spec, actors=2, num_cpus=0.25)
    try:
        items = [TaskItem(id=str(i), prompt="?", answer="1", kind="math") for i in range(6)]
        served_by = [int(s.reward) for s in group.score(items, ["pid"] * 6)]
        assert served_by[:3] == [served_by[0]] * 3 and served_by[3:] == [served_by[3]] * 3
        assert served_by[0] != served_by[3]  # one chunk per actor, each with its own worker
        assert [s.reward for s in group.score(items, ["1", "2", "1", "0", "1", "x"])] == [1, 0, 1, 0, 1, 0]
        assert group.stats()["reward/ok_total"] == 12.0
        assert group.score([], []) == []
    finally:
        group.shutdown()
