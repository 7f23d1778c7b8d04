import os
import signal
import threading

import pytest
from prometheus_client import REGISTRY

from tests.proc_helpers import alive, wait_until
from tests.reward.reward_fixtures import HANGING_MATH
from tgc_rl.config import TaskSpec
from tgc_rl.reward import RewardPool, RewardPoolError
from tgc_rl.tasks import TaskItem, load_task

FIXTURES = "tests.reward.reward_fixtures"
JUDGE = f"{FIXTURES}:judge"


def math_item(answer: str, i: int = 0) -> TaskItem:
    return TaskItem(id=f"m{i}", prompt="?", answer=answer, kind="math")


@pytest.fixture(scope="module")
def arith_pool():
    # the deadline bounds the hung cases; a loaded 2-core machine (two test workers, Ray beside) can starve a
    # sound verification for seconds, so it is long enough never to cut one
    with RewardPool(TaskSpec(name="arithmetic", reward_workers=2, reward_timeout_s=10.0), seed=0) as pool:
        yield pool


@pytest.fixture(scope="module")
def judge_pool():
    spec = TaskSpec(name="arithmetic", reward=JUDGE, reward_workers=2, reward_timeout_s=10.0)
    with RewardPool(spec, seed=0) as pool:
        yield pool


def counter(task: str, status: str) -> float:
    labels = {"task": task, "status": status}
    return REGISTRY.get_sample_value("tgc_reward_verifications_total", labels) or 0.0


# -- built-in verification ---------------------------------------------------------------------------------
def test_scores_come_back_in_request_order(arith_pool):
    task = load_task("arithmetic", {}, 0)
    items = [task.item(i) for i in range(12)]
    responses = [it.answer if i % 3 else f"{int(it.answer) + 1}" for i, it in enumerate(items)]
    scores = arith_pool.score(items, responses)
    assert [s.reward for s in scores] == [0.0 if i % 3 == 0 else 1.0 for i in range(12)]
    assert {s.status for s in scores} == {"ok"}


def test_math_items_equal_symbolically_score_one(arith_pool):
    half = math_item("\\frac{1}{2}")
    scores = arith_pool.score([half, half], ["so it is 0.5", "it is 0.4"])
    assert [s.reward for s in scores] == [1.0, 0.0]
    assert scores[0].detail == "math-verify"


def test_hung_verification_is_killed_marked_timeout_and_its_worker_replaced(arith_pool):
    before_pids = set(arith_pool.worker_pids)
    before = counter("arithmetic", "timeout")
    scores = arith_pool.score([math_item(HANGING_MATH[0]), math_item("7", 1)], [HANGING_MATH[1], "7"])
    assert scores[0].status == "timeout" and scores[0].reward == 0.0
    assert "killed and replaced" in scores[0].detail
    assert scores[1].status == "ok" and scores[1].reward == 1.0
    killed = before_pids - set(arith_pool.worker_pids)
    assert len(killed) == 1 and not alive(killed.pop())
    assert counter("arithmetic", "timeout") == before + 1
    assert wait_until(
        lambda: len(arith_pool.worker_pids) == 2 and arith_pool.stats()["reward/workers_alive"] == 2,
        timeout=60,
    )
    assert arith_pool.score([math_item("3")], ["3"])[0].reward == 1.0


def test_worker_killed_from_outside_while_idle_is_replaced(arith_pool):
    assert wait_until(lambda: arith_pool.stats()["reward/workers_alive"] == 2, timeout=60)
    victim = arith_pool.worker_pids[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_until(
        lambda: victim not in arith_pool.worker_pids and len(arith_pool.worker_pids) == 2, timeout=60
    )
    scores = arith_pool.score([math_item(str(i), i) for i in range(6)], [str(i) for i in range(6)])
    assert [s.reward for s in scores] == [1.0] * 6


def test_stats_report_since_last_call_and_cumulative_counts(arith_pool):
    arith_pool.stats()  # reset the window
    total_before = arith_pool.stats()["reward/ok_total"]
    arith_pool.score([math_item("1"), math_item("2", 1)], ["1", "5"])
    stats = arith_pool.stats()
    assert stats["reward/ok"] == 2.0 and stats["reward/timeouts"] == 0.0 and stats["reward/errors"] == 0.0
    assert stats["reward/ok_total"] == total_before + 2
    assert stats["reward/latency_p99_s"] >= stats["reward/latency_p50_s"] > 0.0
    assert arith_pool.stats()["reward/ok"] == 0.0


def test_a_burst_of_a_thousand_requests_loses_none(arith_pool):
    before = arith_pool.stats()["reward/ok_total"]
    items = [math_item(str(i % 50), i) for i in range(1000)]
    responses = [str(i % 50) if i % 2 else "wrong" for i in range(1000)]
    scores = arith_pool.score(items, responses)
    assert len(scores) == 1000 and {s.status for s in scores} == {"ok"}
    assert [s.reward for s in scores] == [float(i % 2) for i in range(1000)]
    assert arith_pool.stats()["reward/ok_total"] == before + 1000  # each one counted once


def test_mismatched_items_and_responses_are_refused(arith_pool):
    with pytest.raises(ValueError, match="one response per item"):
        arith_pool.score([math_item("1")], ["1", "2"])


# -- custom rewards ----------------------------------------------------------------------------------------
def test_custom_reward_function_scores_in_the_pool(judge_pool):
    scores = judge_pool.score([math_item("4"), math_item("4", 1), math_item("4", 2)], ["4", "5", "graded"])
    assert [(s.reward, s.status) for s in scores] == [(1.0, "ok"), (0.0, "ok"), (0.5, "ok")]
    assert scores[2].detail == "half credit"


@pytest.mark.parametrize(
    "response,needle",
    [
        ("raise", "cannot judge this"),
        ("wrong-type", "returned str"),
        ("nan", "non-finite"),
        ("exit", "SystemExit"),
    ],
)
def test_failing_custom_reward_is_an_error_and_the_worker_keeps_serving(judge_pool, response, needle):
    pids = set(judge_pool.worker_pids)
    score = judge_pool.score([math_item("4")], [response])[0]
    assert score.status == "error" and score.reward == 0.0
    assert needle in score.detail
    assert set(judge_pool.worker_pids) == pids


def test_crashing_custom_reward_is_an_error_and_its_worker_replaced(judge_pool):
    assert wait_until(lambda: judge_pool.stats()["reward/workers_alive"] == 2, timeout=60)
    restarts = judge_pool.stats()["reward/worker_restarts_total"]
    score = judge_pool.score([math_item("4")], ["crash"])[0]
    assert score.status == "error"
    assert "SIGSEGV" in score.detail
    assert judge_pool.stats()["reward/worker_restarts_total"] == restarts + 1
    assert judge_pool.score([math_item("4")], ["4"])[0].reward == 1.0


def test_hanging_custom_reward_times_out(judge_pool):
    score = judge_pool.score([math_item("4")], ["hang"])[0]
    assert score.status == "timeout"


def test_worker_output_does_not_corrupt_the_protocol(judge_pool):
    scores = judge_pool.score([math_item("4"), math_item("4", 1)], ["chatty", "4"])
    assert [(s.reward, s.status) for s in scores] == [(1.0, "ok"), (1.0, "ok")]


def test_a_slow_sample_does_not_hold_up_the_other_workers(judge_pool):
    assert wait_until(lambda: judge_pool.stats()["reward/workers_alive"] == 2, timeout=60)
    scores = judge_pool.score([math_item("0", i) for i in range(4)], ["slow", "pid", "pid", "pid"])
    served_by = {int(s.reward) for s in scores[1:]}
    assert scores[0].reward == 1.0
    assert len(served_by) == 1 and served_by <= set(judge_pool.worker_pids)


def test_back_pressure_blocks_submitters_beyond_max_pending(no_new_children):
    spec = TaskSpec(name="arithmetic", reward=JUDGE, reward_workers=1, reward_timeout_s=10.0)
    with RewardPool(spec, max_pending=2) as pool:
        first = [pool.submit(math_item("1"), "slow"), pool.submit(math_item("1"), "slow")]
        third_submitted = threading.Event()

        def submit_third():
            pool.submit(math_item("1"), "1").result()
            third_submitted.set()

        t = threading.Thread(target=submit_third)
        t.start()
        assert not third_submitted.wait(0.5)  # both slots are taken by slow samples
        assert not all(f.done() for f in first)
        assert third_submitted.wait(30)
        t.join()
        assert [f.result().reward for f in first] == [1.0, 1.0]


# -- lifecycle ---------------------------------------------------------------------------------------------
def test_close_stops_every_worker_and_fails_queued_samples(no_new_children):
    spec = TaskSpec(name="arithmetic", reward=JUDGE, reward_workers=1, reward_timeout_s=60.0)
    pool = RewardPool(spec)
    pids = pool.worker_pids
    futures = [pool.submit(math_item("1"), "hang"), pool.submit(math_item("1"), "1")]
    assert wait_until(lambda: pool.stats()["reward/queue_depth"] == 1, timeout=60)  # the worker took "hang"
    pool.close()
    assert [f.result(timeout=10).status for f in futures] == ["error", "error"]
    assert all(not alive(p) for p in pids)
    with pytest.raises(RewardPoolError, match="closed"):
        pool.submit(math_item("1"), "1")
    pool.close()  # idempotent


def test_unknown_task_fails_at_start_with_the_reason(no_new_children):
    # the spec refuses the name at parse time; the pool must still fail cleanly on an unvalidated one
    spec = TaskSpec.model_construct(**{**TaskSpec().model_dump(), "name": "nope", "reward_workers": 1})
    with pytest.raises(RewardPoolError, match="unknown task.name 'nope'"):
        RewardPool(spec)


def test_unimportable_custom_reward_fails_at_start_with_the_reason(no_new_children):
    with pytest.raises(RewardPoolError, match=f"task.reward '{FIXTURES}:missing'"):
        RewardPool(TaskSpec(name="arithmetic", reward=f"{FIXTURES}:missing", reward_workers=1))


def test_non_callable_custom_reward_fails_at_start(no_new_children):
    with pytest.raises(RewardPoolError, match="not callable"):
        RewardPool(TaskSpec(name="arithmetic", reward=f"{FIXTURES}:not_callable", reward_workers=1))
