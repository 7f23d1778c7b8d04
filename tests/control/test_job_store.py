import threading
import time

import pytest
import sqlalchemy as sa

from tgc_rl.control.db import make_engine
from tgc_rl.control.migrations import migrate
from tgc_rl.control.states import JobState
from tgc_rl.control.store import IdempotencyConflict, InvalidTransition, JobStore, QueueFull


@pytest.fixture
def store(tmp_path) -> JobStore:
    engine = make_engine(f"sqlite:///{tmp_path}/jobs.db")
    migrate(engine)
    return JobStore(engine)


SPEC = {"name": "a", "steps": 3}


def test_new_job_is_queued_with_its_first_transition(store):
    job, created = store.create("acme", SPEC)
    assert created and job.state == JobState.QUEUED
    assert [(t.from_state, t.to_state, t.reason) for t in job.transitions] == [
        (None, JobState.QUEUED, "accepted")
    ]


def test_same_idempotency_key_returns_the_same_job(store):
    first, created1 = store.create("acme", SPEC, "key-1")
    again, created2 = store.create("acme", SPEC, "key-1")
    assert created1 and not created2 and again.id == first.id


def test_idempotency_keys_are_per_tenant(store):
    a, _ = store.create("acme", SPEC, "key-1")
    b, created = store.create("globex", SPEC, "key-1")
    assert created and a.id != b.id


def test_reusing_an_idempotency_key_with_another_spec_is_a_conflict(store):
    store.create("acme", SPEC, "key-1")
    with pytest.raises(IdempotencyConflict, match="different spec"):
        store.create("acme", {**SPEC, "steps": 4}, "key-1")


def test_racing_requests_with_one_key_create_one_job(store):
    ids: list[str] = []

    def submit() -> None:
        ids.append(store.create("acme", SPEC, "race")[0].id)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert len(store.list("acme")) == 1


def test_transition_records_time_reason_and_previous_state(store):
    job, _ = store.create("acme", SPEC)
    job = store.start_attempt(job, "tgc-x-1", "/tmp/run")
    job = store.transition(job.id, JobState.RUNNING, "trainer started")
    last = job.transitions[-1]
    assert (last.from_state, last.to_state, last.reason) == (
        JobState.STARTING,
        JobState.RUNNING,
        "trainer started",
    )
    assert last.time >= job.transitions[0].time


def test_transition_not_allowed_by_the_lifecycle_is_refused(store):
    job, _ = store.create("acme", SPEC)
    with pytest.raises(InvalidTransition):
        store.transition(job.id, JobState.RUNNING, "skipping starting")


def test_transition_from_an_unexpected_state_is_refused(store):
    job, _ = store.create("acme", SPEC)
    store.start_attempt(job, "tgc-x-1", "/tmp/run")
    with pytest.raises(InvalidTransition):
        store.transition(job.id, JobState.FAILED, "x", expect=frozenset({JobState.QUEUED}))


def test_cancel_of_a_queued_job_ends_it_at_once(store):
    job, _ = store.create("acme", SPEC)
    job = store.request_cancel(job.id, "not needed")
    assert job.state == JobState.CANCELLED and "not needed" in job.reason


def test_cancel_of_a_running_job_only_flags_it(store):
    job, _ = store.create("acme", SPEC)
    job = store.start_attempt(job, "tgc-x-1", "/tmp/run")
    job = store.request_cancel(job.id, "enough")
    assert (
        job.state == JobState.STARTING
        and job.cancel_requested_at is not None
        and job.cancel_reason == "enough"
    )


def test_resume_starts_a_new_attempt_from_the_checkpoint(store):
    job, _ = store.create("acme", SPEC)
    job = store.start_attempt(job, "tgc-x-1", "/tmp/run")
    store.transition(job.id, JobState.FAILED, "boom")
    store.update(job.id, ray_done=True)
    job = store.resume(job.id, "/tmp/run/checkpoints/step_2", "again")
    assert job.state == JobState.QUEUED and job.attempt == 2 and job.resume_from.endswith("step_2")
    assert job.ray_submission_id is None and job.cancel_requested_at is None


def test_list_pages_newest_first_without_gaps(store):
    ids = [store.create("acme", {**SPEC, "name": f"j{i}"})[0].id for i in range(7)]
    page1 = store.list("acme", limit=3)
    page2 = store.list("acme", limit=3, before_seq=page1[-1].seq)
    page3 = store.list("acme", limit=3, before_seq=page2[-1].seq)
    assert [j.id for j in page1 + page2 + page3] == ids[::-1]


def test_list_filters_by_tenant_and_state(store):
    a, _ = store.create("acme", SPEC)
    store.create("globex", SPEC)
    store.request_cancel(a.id, "x")
    assert [j.id for j in store.list("acme", [JobState.CANCELLED])] == [a.id]
    assert store.list("acme", [JobState.QUEUED]) == []


# -- queued-job quota -----------------------------------------------------------------------------
def _limited(store: JobStore, max_queued: int) -> JobStore:
    return JobStore(store.engine, max_queued=max_queued)


def test_the_queued_quota_counts_a_tenants_queued_jobs_only(store):
    store = _limited(store, 2)
    a, _ = store.create("acme", SPEC)
    store.create("acme", SPEC)
    with pytest.raises(QueueFull, match="max_queued_jobs = 2"):
        store.create("acme", SPEC)
    assert store.create("globex", SPEC)[1]  # another tenant's queue
    store.start_attempt(a, "tgc-a-1", "/tmp/run")  # started: no longer queued
    assert store.create("acme", SPEC)[1]


def test_resume_beyond_the_queued_quota_is_refused_and_changes_nothing(store):
    store = _limited(store, 1)
    job, _ = store.create("acme", SPEC)
    job = store.start_attempt(job, "tgc-x-1", "/tmp/run")
    store.transition(job.id, JobState.FAILED, "boom")
    store.update(job.id, ray_done=True)
    store.create("acme", SPEC)
    with pytest.raises(QueueFull):
        store.resume(job.id, "/tmp/run/checkpoints/step_2", "again")
    after = store.get(job.id)
    assert after.state == JobState.FAILED and after.attempt == 1


def test_concurrent_submissions_never_overshoot_the_queued_quota(store):
    store = _limited(store, 3)
    results: list[str] = []

    def submit() -> None:
        try:
            store.create("acme", SPEC)
            results.append("created")
        except QueueFull:
            results.append("full")

    threads = [threading.Thread(target=submit) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["created"] * 3 + ["full"] * 7
    assert len(store.list("acme", [JobState.QUEUED])) == 3


# -- retention ------------------------------------------------------------------------------------
def _ended(store: JobStore, tenant: str = "acme") -> str:
    job, _ = store.create(tenant, SPEC)
    return store.request_cancel(job.id, "done").id


def _rows(store: JobStore, job_id: str) -> int:
    from tgc_rl.control import db

    with store.read() as conn:
        return sum(
            conn.execute(sa.select(sa.func.count()).select_from(t).where(t.c.job_id == job_id)).scalar_one()
            for t in (db.events, db.metrics, db.checkpoints, db.transitions, db.driver_logs)
        )


def test_retention_by_age_deletes_ended_jobs_with_their_rows_and_nothing_else(store):
    old = _ended(store)
    store.save_driver_log(old, 1, "tail")
    queued, _ = store.create("acme", SPEC)
    running, _ = store.create("acme", SPEC)
    running = store.start_attempt(running, "tgc-r-1", "/tmp/run")
    lingering = store.start_attempt(store.create("acme", SPEC)[0], "tgc-l-1", "/tmp/run")
    store.transition(lingering.id, JobState.FAILED, "boom")  # ended, but its Ray job is not gone yet
    assert store.expire_ended(max_age_s=50, keep_per_tenant=0) == []  # nothing is old enough yet
    gone = store.expire_ended(max_age_s=50, keep_per_tenant=0, now=time.time() + 100)
    assert [(g.id, g.tenant) for g in gone] == [(old, "acme")]
    assert store.get(old) is None and _rows(store, old) == 0
    for kept in (queued.id, running.id, lingering.id):
        assert store.get(kept) is not None and _rows(store, kept) > 0
    store.update(lingering.id, ray_done=True)
    assert [g.id for g in store.expire_ended(50, 0, now=time.time() + 100)] == [lingering.id]


def test_retention_by_count_keeps_each_tenants_most_recently_ended(store):
    acme = [_ended(store) for _ in range(5)]
    globex = [_ended(store, "globex") for _ in range(2)]
    queued, _ = store.create("acme", SPEC)
    gone = store.expire_ended(max_age_s=0, keep_per_tenant=2, batch=2)
    assert len(gone) == 2  # a batch at a time
    gone += store.expire_ended(max_age_s=0, keep_per_tenant=2, batch=2)
    assert store.expire_ended(max_age_s=0, keep_per_tenant=2, batch=2) == []
    assert sorted(g.id for g in gone) == sorted(acme[:3])
    left = {j.id for j in store.list()}
    assert left == {*acme[3:], *globex, queued.id}


def test_retention_off_deletes_nothing(store):
    _ended(store)
    assert store.expire_ended(max_age_s=0, keep_per_tenant=0, now=time.time() + 10**9) == []
