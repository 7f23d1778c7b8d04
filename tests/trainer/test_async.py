"""k-step asynchrony: `async.mode: k_step` keeps up to k = `async.max_staleness` rollouts generated ahead of the
learner; the bound is checked per rollout and the lag is measured per step."""

import math
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from tgc_rl import run_layout as rl
from tgc_rl.batch import Completion
from tgc_rl.config import MAX_ASYNC_DEPTH, JobSpec, SpecError
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.trainer.checkpoints import read_state
from tgc_rl.trainer.data import Prompt
from tgc_rl.trainer.loop import Group, Rollout, Trainer, _drain, _lag

from .conftest import read_metrics, tiny_spec


@pytest.mark.parametrize("k", [0, 1, MAX_ASYNC_DEPTH + 1])
def test_k_step_refuses_a_depth_outside_its_range_naming_the_field(k):
    with pytest.raises(SpecError, match=r"async\.max_staleness must be between 2 and") as e:
        JobSpec.parse({"async": {"mode": "k_step", "max_staleness": k}})
    assert f"got {k}" in str(e.value) and "one_step_off" in str(e.value)


def test_the_modes_generate_ahead_as_deep_as_they_say_and_k_step_gets_one_step_offs_threads():
    depth = lambda a: JobSpec.parse({"async": a}).async_.depth  # noqa: E731
    assert depth({}) == 0 and depth({"mode": "one_step_off", "max_staleness": 3}) == 1
    assert depth({"mode": "k_step", "max_staleness": 3}) == 3
    res = {"cpus_per_learner": 1, "cpus_per_rollout": 1}  # both phases at once: each keeps its own
    k_step = JobSpec.parse({"async": {"mode": "k_step", "max_staleness": 2}, "resources": res})
    one_off = JobSpec.parse({"async": {"mode": "one_step_off"}, "resources": res})
    sync = JobSpec.parse({"resources": res})
    for role in ("learner", "rollout"):
        assert k_step.actor_threads(role) == one_off.actor_threads(role)
    assert (k_step.actor_threads("learner"), k_step.actor_threads("rollout")) != (
        sync.actor_threads("learner"),
        sync.actor_threads("rollout"),
    )


def test_lag_is_to_the_oldest_weights_in_the_rollout():
    prompt = Prompt(0, TaskItem(id="0", prompt="q"), [1])
    comps = [Completion([1], [0.0], "stop", v) for v in (5, 3, 5)]
    rollout = Rollout([Group(prompt, comps, [Score(0.0)] * 3)], end_position=1)
    assert _lag(6, rollout) == 3


def test_drain_cancels_queued_rollouts_and_waits_for_the_one_generating():
    started, release = threading.Event(), threading.Event()

    def generating() -> str:
        started.set()
        release.wait(5)
        return "done"

    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(generating)
        queued = pool.submit(lambda: "never")
        ahead: deque[Future] = deque([running, queued])
        assert started.wait(5)
        threading.Timer(0.2, release.set).start()
        _drain(ahead)
        assert running.done() and running.result() == "done"  # nothing is left generating on the worker
        assert queued.cancelled() and not ahead


@pytest.mark.slow
def test_k_step_trains_on_samples_up_to_k_versions_old_with_token_tis_reporting_the_correction_and_resumes(
    ray_cluster, tmp_path
):
    """One k_step job (k = 2, 3 steps, then resumed to 6) for the queue's bound, the resume's data position
    and the async default behaviour correction (token TIS, C = 2) with its metrics (issue 31); its queued
    steps are sampled two to a call (`async.steps_per_call`, issue 33)."""
    from tgc_rl.trainer.main import run

    k = 2
    mode = {
        "async.mode": "k_step",
        "async.max_staleness": k,
        "async.steps_per_call": 2,
        "checkpoint.every_steps": 0,
    }
    # sharper sampling from the random model: once it has learned a little, a group's responses share tokens
    sharp = {"sampling.temperature": 0.1}
    # no override: the async default correction applies
    assert run(tiny_spec(steps=3, **mode, **sharp), tmp_path) == "succeeded"
    first = read_metrics(tmp_path)
    assert [r["step"] for r in first] == [1, 2, 3]
    _assert_the_k_step_correction_is_reported(first, k)
    assert run(tiny_spec(steps=6, **mode, **sharp), tmp_path, resume="latest") == "succeeded"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["policy/version"] for r in rows] == [1, 2, 3, 4, 5, 6]
    lags = [r["policy/staleness_max"] for r in rows]
    # the first step of each run is sampled before any update (a resume stamps the checkpoint's version)
    assert lags[0] == 0 and lags[3] == 0
    assert max(lags) == k  # two rollouts were generated ahead while the learner trained: lag 2 occurs ...
    assert all(0 <= lag <= k for lag in lags)  # ... and never more than k
    assert all(r["rollout/stale_dropped"] == 0 for r in rows)  # the queue's depth keeps every one in bound
    # the first step of a run alone, then two steps a call, both sampled by one weights version
    assert [r[rl.ROLLOUT_STEPS_PER_CALL] for r in rows] == [1, 2, 2, 1, 2, 2]
    sampled_by = [r["policy/version"] - 1 - r["policy/staleness_max"] for r in rows]
    assert sampled_by[1] == sampled_by[2] == 0 and sampled_by[4] == sampled_by[5] == 3
    # queued rollouts never trained on are sampled again after the resume: the position is the trained data's
    assert read_state(tmp_path / "checkpoints" / "step_6")["data_position"] == 6 * 2


def _assert_the_k_step_correction_is_reported(rows: list[dict], k: int) -> None:
    """The async default correction (token TIS, C = 2) in the rows of a real cp_grpo job with lag bound k
    (one_step_off is k = 1): this k_step job on the HF engine, and on vLLM with 2 FSDP learner ranks
    tests/trainer/test_e2e.py's one_step_off job."""
    for r in rows:
        assert 0.0 <= r[rl.BEHAVIOUR_CORRECTED_FRAC] <= 1.0  # only reported where a correction runs
        assert 0.0 < r["objective/behaviour/coef_mean"] <= 2.0  # min(w, C = 2)
        assert math.isfinite(r[rl.MISMATCH_K3]) and r[rl.MISMATCH_K3] >= 0.0
        # the spread is measured where copies of a shared token exist; one version sampled each group with one
        # engine, so the copies' behaviour log-probs agree and token TIS keeps cancellation
        assert (rl.MISMATCH_SPREAD_MAX in r) == (r["mismatch/shared_pairs"] > 0)
        assert 0.0 <= r.get(rl.MISMATCH_SPREAD_MEAN, 0.0) <= r.get(rl.MISMATCH_SPREAD_MAX, 0.0) <= 1e-5
        # D2 where the objective cancels: measured on the same shared tokens, at the TgcCancellationBroken
        # alert's threshold at most
        assert r[rl.PRESERVES_CANCELLATION] == 1.0
        assert (rl.D2_RESIDUAL in r) == (r["mismatch/shared_pairs"] > 0)
        assert r.get(rl.D2_RESIDUAL, 0.0) <= 1e-4
    assert any(r["mismatch/shared_pairs"] > 0 for r in rows)
    lags = [r[rl.POLICY_STALENESS_MAX] for r in rows]
    assert lags[0] == 0 and 0 < max(lags) <= k
    # the lag is what the correction sees: a step sampled by weights k versions old is further from the
    # learner's pi_old than step 1, where engine and learner hold the same weights (numerics only)
    lagged = lags.index(max(lags))
    assert rows[lagged][rl.MISMATCH_K3] > 100 * rows[0][rl.MISMATCH_K3]
    assert rows[lagged][rl.BEHAVIOUR_CORRECTED_FRAC] > 0.0 == rows[0][rl.BEHAVIOUR_CORRECTED_FRAC]


class _Queue(Trainer):
    """The loop's `run()` alone: a rollout is stamped with the version the learner has when it is generated,
    a training step advances the version (no Ray, no model)."""

    def __init__(self, spec: JobSpec, tags: dict[int, int] | None = None, due: list[int] | None = None):
        self.spec, self.step, self.version, self.resumed, self.evaluator = spec, 0, 0, False, None
        self.stop_reason, self.tags, self.logged, self.due, self.calls = None, tags or {}, [], due, []
        self.data = SimpleNamespace(position=0, available=lambda n: True)
        self.data.task = SimpleNamespace(available=lambda index: True)
        self.reporter = SimpleNamespace(state=lambda *a: None, step=lambda *a: None, log=lambda *a: None)
        self.metrics = SimpleNamespace(log=lambda step, m: self.logged.append(m))
        self.residuals = SimpleNamespace(check=lambda *a: None)
        self.generated = 0

    def _rollouts(self, steps: int) -> list[Rollout]:
        self.calls.append(steps)
        out = []
        for _ in range(steps):  # one call: one weights version (a tag: a replica older than it says)
            version = self.tags.get(self.generated, self.version)
            self.generated += 1
            self.data.position += 1
            prompt = Prompt(0, TaskItem(id="0", prompt="q"), [1])
            group = Group(prompt, [Completion([1], [0.0], "stop", version)], [Score(0.0)])
            out.append(Rollout([group], self.data.position))
        return out

    def train_step(self, rollout: Rollout) -> dict[str, float]:
        lag = _lag(self.version, rollout)
        # the learner is slower than generation: what the queue should hold is generated before the update
        # (a deadline, not a fixed sleep, so a loaded machine does not change the lags)
        due = (
            self.due[self.step] if self.due else min(self.step + 1 + self.spec.async_.depth, self.spec.steps)
        )
        deadline = time.monotonic() + 5
        while self.generated < due and time.monotonic() < deadline:
            time.sleep(0.01)
        self.version += 1
        return {"lag": float(lag), "response/tokens": 1.0}

    def save(self) -> Path:
        return Path()

    def _should_stop(self) -> bool:
        return False


def _queue(mode: str, k: int, steps: int = 6, per_call: int = 1, **kw) -> _Queue:
    spec = JobSpec.parse(
        {"steps": steps, "async": {"mode": mode, "max_staleness": k, "steps_per_call": per_call}}
    )
    loop = _Queue(spec, **kw)
    assert loop.run() == "succeeded"
    return loop


def test_the_queue_holds_k_rollouts_ahead_and_each_is_trained_within_k_versions():
    for k in (2, 3):
        loop = _queue("k_step", k)
        # the queue fills while step 1 trains; then every rollout waited k steps: the bound, never more
        assert [m["lag"] for m in loop.logged] == [0] + [min(s, k) for s in range(1, 6)]
        assert loop.generated == 6  # none beyond the last step
    assert [m["lag"] for m in _queue("one_step_off", 1).logged] == [0, 1, 1, 1, 1, 1]
    assert [m["lag"] for m in _queue("sync", 1).logged] == [0] * 6


def test_a_rollout_older_than_the_bound_is_dropped_counted_and_sampled_afresh():
    loop = _queue("k_step", 2, tags={2: -5})  # the second queued rollout claims weights 5 versions old
    assert [m["rollout/stale_dropped"] for m in loop.logged] == [0, 0, 1, 0, 0, 0]
    assert max(m["lag"] for m in loop.logged) <= 2 and loop.logged[2]["lag"] == 0


def test_steps_per_call_samples_queued_steps_in_one_call_and_keeps_every_lag_within_k():
    # k = 2, two steps a call: a call is submitted once both fit under the bound; generated while step 1 trains
    # (version 0) its steps lag 1 and 2; the next, while step 3 trains (version 2), lag 1 and 2; the last step,
    # alone, while step 4 trains (version 3)
    loop = _queue("k_step", 2, per_call=2, due=[3, 3, 5, 6, 6, 6])
    assert [m["lag"] for m in loop.logged] == [0, 1, 2, 1, 2, 2]
    assert loop.calls == [1, 2, 2, 1] and loop.generated == 6
    # k = 3: the next call is submitted while the last one's first step trains, so the engine is never idle
    loop = _queue("k_step", 3, per_call=2, due=[3, 5, 6, 6, 6, 6])
    assert [m["lag"] for m in loop.logged] == [0, 1, 2, 2, 3, 3]
    assert loop.calls == [1, 2, 2, 1] and max(m["lag"] for m in loop.logged) <= 3


@pytest.mark.parametrize(
    "spec",
    [
        {"mode": "one_step_off", "steps_per_call": 2},
        {"mode": "sync", "steps_per_call": 2},
        {"mode": "k_step", "max_staleness": 2, "steps_per_call": 3},
    ],
)
def test_steps_per_call_is_refused_outside_k_step_or_above_k_naming_the_field(spec):
    with pytest.raises(SpecError, match=r"async.steps_per_call .*max_staleness"):
        JobSpec.parse({"async": spec})


class _Dealer(Trainer):
    """`_rollouts` alone over a fake engine call: prompt i's group is informative unless i % 3 == 0, and the
    indices in `drop` come back without a group (a multi-turn group whose trajectories all failed)."""

    def __init__(self, dynamic: bool, drop: frozenset[int] = frozenset()):
        self.spec = JobSpec.parse({"prompts_per_step": 2, "dynamic_sampling": dynamic})
        self.step, self.sampler, self.drop, self.takes = 0, None, drop, []
        self.data = SimpleNamespace(position=0, available=lambda n: True, take=self._take)
        self.credit = SimpleNamespace(after_rollout=lambda groups, *a: None)
        self.rollout = self.rewards = None

    def _take(self, n: int) -> list[Prompt]:
        out = [Prompt(self.data.position + k, TaskItem(id="q", prompt="q"), [1]) for k in range(n)]
        self.data.position += n
        self.takes.append(n)
        return out

    def _generate_groups(self, prompts, attempt=0):
        groups = [
            Group(p, [Completion([1], [0.0], "stop", 0)] * 2, [Score(0.0), Score(float(p.index % 3 != 0))])
            for p in prompts
            if p.index not in self.drop
        ]
        return groups, {"timing/generate": 6.0, "timing/reward": 3.0}


def _dealt(rollouts: list[Rollout]) -> list[tuple[list[int], int]]:
    return [([g.prompt.index for g in r.groups], r.end_position) for r in rollouts]


def test_one_call_of_three_steps_is_dealt_in_data_order_each_ending_where_a_resume_starts():
    plain = _Dealer(dynamic=False)
    rollouts = plain._rollouts(3)
    assert plain.takes == [6]  # one engine call
    assert _dealt(rollouts) == [([0, 1], 2), ([2, 3], 4), ([4, 5], 6)]
    for r in rollouts:  # the call's time shared out, so a step's timings still add up to the job's
        assert r.metrics["timing/generate"] == 2.0 and r.metrics[rl.ROLLOUT_STEPS_PER_CALL] == 3.0
    # dynamic sampling over the call: 0 and 3, then 6 have no signal and are replaced from the data after it
    dynamic = _Dealer(dynamic=True)
    rollouts = dynamic._rollouts(3)
    assert dynamic.takes == [6, 2, 1]
    assert _dealt(rollouts) == [([1, 2], 3), ([4, 5], 6), ([7, 8], 9)]
    assert [r.metrics["rollout/groups_dropped"] for r in rollouts] == [1.0] * 3
    # groups lost in the call: the steps share what is left, the last one ends after every prompt taken
    assert _dealt(_Dealer(dynamic=False, drop=frozenset({4, 5}))._rollouts(3)) == [
        ([0, 1], 2),
        ([2], 3),
        ([3], 6),
    ]
    assert _dealt(_Dealer(dynamic=False, drop=frozenset({1, 2, 3, 4, 5}))._rollouts(3)) == [([0], 6)]
