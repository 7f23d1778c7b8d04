import json
import time

import pytest

from tgc_rl.control import progress
from tgc_rl.control.db import make_engine
from tgc_rl.control.migrations import migrate
from tgc_rl.control.states import JobState
from tgc_rl.control.store import JobStore


@pytest.fixture
def store(tmp_path) -> JobStore:
    engine = make_engine(f"sqlite:///{tmp_path}/jobs.db")
    migrate(engine)
    return JobStore(engine)


@pytest.fixture
def running(store):
    job, _ = store.create("acme", {"name": "a", "steps": 5})
    job = store.start_attempt(job, "tgc-x-1", "/tmp/run")
    return job


def ev(type_: str, **fields):
    return progress.normalize_event({"type": type_, "time": time.time(), **fields})


def test_running_report_moves_a_starting_job_to_running(store, running):
    result = progress.ingest(store, running.id, 1, [ev("state", state="running", reason="started", step=0)])
    assert result.job.state == JobState.RUNNING


def test_step_events_become_a_metric_series_and_the_latest_metrics(store, running):
    progress.ingest(store, running.id, 1, [ev("step", step=s, metrics={"reward": s / 10}) for s in (1, 2, 3)])
    rows = progress.metric_rows(store, running.id)
    assert [(r.step, r.metrics["reward"]) for r in rows] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    job = store.get(running.id)
    assert job.step == 3 and job.latest_metrics == {"reward": 0.3}


def test_a_resent_batch_is_stored_once(store, running):
    batch = [ev("step", step=1, metrics={"loss": 1.0}), ev("log", message="hello")]
    first = progress.ingest(store, running.id, 1, batch)
    again = progress.ingest(store, running.id, 1, batch)
    assert len(first.stored) == 2 and again.stored == []
    assert len(progress.events_since(store, running.id, types=["log"])) == 1


def test_non_finite_metrics_are_stored_as_null(store, running):
    progress.ingest(
        store, running.id, 1, [ev("step", step=1, metrics={"loss": float("nan"), "r": float("inf")})]
    )
    assert progress.metric_rows(store, running.id)[0].metrics == {"loss": None, "r": None}


def test_cancelled_report_keeps_the_users_reason_and_last_step(store, running):
    store.request_cancel(running.id, "budget exhausted")
    progress.ingest(
        store,
        running.id,
        1,
        [
            ev("state", state="running", reason="started", step=0),
            ev("step", step=2, metrics={}),
            ev("checkpoint", step=2, path="/tmp/run/checkpoints/step_2"),
            ev("state", state="cancelled", reason="cancel requested", step=2),
        ],
    )
    job = store.get(running.id)
    assert (
        job.state == JobState.CANCELLED and "budget exhausted" in job.reason and "last step 2" in job.reason
    )
    assert [c.step for c in progress.checkpoint_rows(store, running.id)] == [2]


def test_late_state_report_after_the_end_changes_nothing(store, running):
    progress.ingest(store, running.id, 1, [ev("state", state="failed", reason="boom", step=1)])
    progress.ingest(store, running.id, 1, [ev("state", state="running", reason="zombie", step=1)])
    assert store.get(running.id).state == JobState.FAILED


def test_reports_of_an_older_attempt_do_not_touch_the_current_one(store, running):
    progress.ingest(store, running.id, 1, [ev("state", state="failed", reason="boom", step=1)])
    store.update(running.id, ray_done=True)
    store.resume(running.id, "/ck", "again")
    progress.ingest(store, running.id, 1, [ev("step", step=9, metrics={"x": 1.0})])
    assert store.get(running.id).step == 1  # still the failed attempt's last step, not 9


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"type": "step", "time": 1.0, "metrics": {}}, "step"),
        ({"type": "step", "time": 1.0, "step": 1, "metrics": {"a": "x"}}, "metrics.a"),
        ({"type": "state", "time": 1.0, "state": "queued"}, "state"),
        ({"type": "checkpoint", "time": 1.0, "step": 1}, "path"),
        ({"type": "log"}, "time"),
    ],
)
def test_malformed_events_are_refused_naming_the_field(bad, field):
    with pytest.raises(progress.EventError, match=rf"events\[0\]\.{field}"):
        progress.normalize_event(bad)


def test_run_dir_events_are_read_and_a_torn_last_line_is_skipped(tmp_path):
    lines = [json.dumps({"type": "step", "time": 1.0, "step": 1, "metrics": {"a": 1}}), '{"type": "st']
    (tmp_path / "events.jsonl").write_text("\n".join(lines))
    events = progress.read_run_dir_events(str(tmp_path))
    assert [e.type for e in events] == ["step"]
    assert progress.read_run_dir_events(str(tmp_path / "missing")) is None


def test_reading_the_run_dir_after_reports_adds_nothing_twice(store, running, tmp_path):
    raw = [
        {"type": "step", "time": 1.5, "step": 1, "metrics": {"a": 1.0}},
        {"type": "log", "time": 1.6, "message": "m"},
    ]
    progress.ingest(store, running.id, 1, [progress.normalize_event(e) for e in raw])
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in raw))
    again = progress.ingest(store, running.id, 1, progress.read_run_dir_events(str(tmp_path)))
    assert again.stored == []
