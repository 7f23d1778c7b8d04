"""End to end: the control plane (uvicorn child process) runs the real trainer on a real local Ray head.

One managed Ray head (`ray_address: local`) serves the whole module; each job is the tiny random-init
Llama with the transformers rollout engine.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.proc_helpers import wait_for, wait_until
from tests.servers import control_plane_with_ray
from tests.specs import tiny_model
from tgc_rl.control.db import make_engine
from tgc_rl.control.local import LocalControlPlane
from tgc_rl.control.migrations import migrate
from tgc_rl.control.ray_cluster import LocalRayCluster
from tgc_rl.control.ray_jobs import RayJobs
from tgc_rl.sdk import Client

pytestmark = pytest.mark.slow
JOB_TIMEOUT = 600


def tiny_spec(name: str, steps: int, every: int = 1) -> dict:
    return {
        "name": name,
        "model": tiny_model(),
        "resources": {"rollout_engine": "hf"},
        "group_size": 2,
        "prompts_per_step": 2,
        "sampling": {"max_new_tokens": 8},
        "steps": steps,
        "checkpoint": {"every_steps": every, "keep_last": 2},
        "task": {"reward_workers": 1},
    }


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def plane(data_dir):
    with control_plane_with_ray(data_dir, "--cancel-grace", "120") as cp:
        yield cp


@pytest.fixture(scope="module")
def ray(plane, data_dir) -> RayJobs:
    """The managed head's Jobs API, as the tests see Ray."""
    head = LocalRayCluster(data_dir)
    assert head.dashboard_url
    return RayJobs(head.dashboard_url, head.token)


@pytest.fixture(scope="module")
def client(plane):
    with Client(plane.url, plane.create_token("acme")) as c:
        yield c


def control_states(job) -> list[str]:
    return [t.state.value for t in job.record.transitions]


def _assert_runs_to_success_and_serves_its_events_metrics_and_checkpoints(job, ray) -> None:
    """A 2-step job (checkpoint every step): followed to its end, then its record, events, metrics,
    checkpoints, driver log and Ray job checked."""
    events = list(job.stream())
    assert job.state.value == "succeeded", job.reason
    assert control_states(job) == ["queued", "starting", "running", "succeeded"]
    assert [e.data["step"] for e in events if e.type == "step"] == [1, 2]
    assert [e.data["state"] for e in events if e.type == "state" and e.data["source"] == "control"] == [
        "queued",
        "starting",
        "running",
        "succeeded",
    ]
    points = job.metrics()
    assert [p.step for p in points] == [1, 2] and "loss" in points[0].metrics
    ckpts = job.checkpoints()
    assert ckpts and ckpts[-1].step == 2 and all(c.exists for c in ckpts if c.step == 2)
    # the driver's stdout is kept; it prints its final state as it exits, which may be a moment after it
    # reported `succeeded` (it still writes curves.png and copies its actors' logs)
    assert wait_until(lambda: "succeeded" in job.driver_log(), timeout=120, interval=1.0), job.driver_log()[
        -2000:
    ]
    sub_id = job.record.ray_submission_id
    wait_for(lambda: ray.info(sub_id).finished, 120, what="driver exit")
    assert ray.info(sub_id).status == "SUCCEEDED"
    wait_for(lambda: not job.refresh().record.driver_running, 30, what="the record noting the driver's exit")


@pytest.fixture(scope="module")
def cancelled_job(plane, ray):
    """A long job cancelled after its first step, and its live actors seen just before the cancel.

    Its tenant's quota is one job, and a 2-step job ("ok") was submitted right after it: that second job's
    state while the first one ran is returned too (the quota test checks both jobs)."""
    with Client(plane.url, plane.create_token("small", max_concurrent=1)) as small:
        job = small.submit(tiny_spec("long", steps=500, every=0))
        second = small.submit(tiny_spec("ok", steps=2))
        for event in job.stream():
            if event.type == "step":
                wait_for(
                    lambda: job.refresh().state.value == "running", JOB_TIMEOUT, what="first job running"
                )
                time.sleep(2)  # several scheduler periods: the second must stay queued
                second_state_while_first_ran = second.refresh().state.value
                actors = ray.alive_actors(job.refresh().record.ray_submission_id)
                job.cancel("enough for today")
                break
        job.wait(JOB_TIMEOUT)
        yield job, actors, second, second_state_while_first_ran  # the client stays open for the jobs' handles


def test_cancel_checkpoints_ends_cancelled_and_leaves_nothing_on_ray(cancelled_job, ray):
    job, actors_before, _, _ = cancelled_job
    assert len(actors_before) >= 2  # learner and rollout actors were there (the check below can fail)
    assert job.state.value == "cancelled" and not job.record.hard_stopped
    assert "enough for today" in job.reason and f"last step {job.step}" in job.reason
    ckpts = job.checkpoints()
    assert [c.step for c in ckpts] == [job.step] and ckpts[0].exists
    sub_id = job.record.ray_submission_id
    wait_for(lambda: ray.info(sub_id).finished, 120, what="Ray job end")
    wait_for(lambda: not ray.alive_actors(sub_id), 120, what="actors gone")


def test_quota_queues_the_second_job_until_the_first_ends_then_it_runs_to_success_and_serves_its_events(
    cancelled_job, ray
):
    """The quota'd tenant's second job (see `cancelled_job`): held while the first one ran, admitted only once
    the first one's Ray job was gone, then run to success with its events, metrics and checkpoints checked."""
    first, _, second, second_state_while_first_ran = cancelled_job
    first_sub_id, first_finished_at = first.record.ray_submission_id, first.record.finished_at
    assert second_state_while_first_ran == "queued"
    _assert_runs_to_success_and_serves_its_events_metrics_and_checkpoints(second, ray)
    assert first.state.value == "cancelled" and second.record.started_at >= first_finished_at
    # Admitted only once the first one's Ray job was gone, not merely once its record ended.
    first_driver_end = ray.details(first_sub_id).end_time / 1000
    assert second.record.started_at.timestamp() >= first_driver_end


def test_resume_runs_a_new_attempt_from_the_checkpoint(cancelled_job):
    job, _, _, _ = cancelled_job
    checkpoint = job.checkpoints()[-1]
    wait_for(lambda: _resumable(job), 120, what="the cancelled attempt's Ray job to end")
    assert job.record.attempt == 2 and job.record.resume_from == checkpoint.path
    for event in job.stream():
        if event.type == "step" and event.attempt == 2:
            assert event.data["step"] > checkpoint.step  # continues from the checkpoint, not from step 1
            job.cancel("resumed enough")
            break
    job.wait(JOB_TIMEOUT)
    assert job.state.value == "cancelled" and job.record.attempt == 2
    assert {p.attempt for p in job.metrics()} == {1, 2}


def _resumable(job) -> bool:
    from tgc_rl.sdk import Conflict

    try:
        job.resume()
        return True
    except Conflict as e:  # the previous attempt's Ray job is still shutting down
        assert "still shutting down" in e.message
        return False


def test_restart_of_the_control_plane_loses_nothing_and_reconciles_with_ray(plane, client, ray):
    job = client.submit(tiny_spec("restart", steps=6, every=3))
    for event in job.stream():
        if event.type == "step":
            break
    before = [p.step for p in job.metrics()]
    sub_id = job.refresh().record.ray_submission_id
    assert before and sub_id
    plane.stop(kill=True)  # a crash, mid-run
    try:
        wait_for(
            lambda: ray.info(sub_id).finished, JOB_TIMEOUT, what="the trainer finishing while we are down"
        )
    finally:
        plane.start()
        plane.wait_ready()
    job.wait(120)
    assert job.state.value == "succeeded", job.reason
    steps = [p.step for p in job.metrics()]
    assert steps == list(range(1, 7)) and set(before) <= set(steps)
    assert [c.step for c in job.checkpoints()] == [3, 6]


@pytest.fixture(scope="module")
def strict_plane(tmp_path_factory, ray):
    """A second control plane on the module's Ray head, with a 3 s cancel grace. Its database starts with a
    `running` job whose Ray job does not exist (Ray lost it while no control plane was up)."""
    data = tmp_path_factory.mktemp("strict")
    engine = make_engine(f"sqlite:///{data / 'tgc.db'}")
    migrate(engine)
    now = time.time()
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, tenant, name, state, reason, spec, created_at, updated_at, attempt, hard_stopped, "
                "ray_submission_id, ray_done, run_dir) VALUES ('job-gone', 'acme', 'gone', 'running', 'started', :spec, "
                ":t, :t, 1, 0, 'tgc-job-gone-1', 0, :run)"
            ),
            {"spec": json.dumps({"steps": 3}), "t": now, "run": str(data / "nowhere")},
        )
    engine.dispose()
    with LocalControlPlane(
        data,
        ray_address=ray.address,
        args=("--poll-interval", "0.5", "--cancel-grace", "3"),
        env={"TGC_RAY_AUTH_TOKEN": ray.headers["Authorization"][7:]},
    ) as cp:
        yield cp


def test_job_whose_ray_job_vanished_is_failed_on_start(strict_plane):
    with Client(strict_plane.url, strict_plane.create_token("acme")) as c:
        job = c.job("job-gone").wait(60)
    assert job.state.value == "failed" and "Ray has no job tgc-job-gone-1" in job.reason


def test_trainer_that_misses_the_grace_period_is_stopped_hard(strict_plane, ray):
    with Client(strict_plane.url, strict_plane.create_token("acme")) as c:
        job = c.submit(tiny_spec("hung", steps=500, every=0))
        for event in job.stream():
            if event.type == "step":
                break
        # Freeze the driver, as a trainer stuck in a collective would be: it can no longer react.
        sub_id = job.refresh().record.ray_submission_id
        pid = ray.details(sub_id).driver_info.pid
        os.kill(int(pid), signal.SIGSTOP)
        job.cancel("stuck")
        job.wait(120)
    assert job.state.value == "cancelled" and job.record.hard_stopped
    assert "stopped hard" in job.reason
    wait_for(lambda: ray.info(sub_id).finished, 60, what="Ray job stopped")
    wait_for(lambda: not ray.alive_actors(sub_id), 120, what="actors gone")


def test_a_managed_ray_head_that_dies_is_started_again(plane, data_dir):
    """Last in this module: it kills the module's head; the plane starts a new one, which the module's
    teardown (control_plane_with_ray) stops."""
    plane.wait_ready()
    head = LocalRayCluster(data_dir)
    first = head.dashboard_url
    head.stop()  # as if the node lost it: every head process gone
    wait_for(lambda: LocalRayCluster(data_dir).dashboard_url not in (None, first), 300, what="a new head")
    plane.wait_ready()
