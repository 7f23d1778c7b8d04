"""A job's progress as the trainer reports it: validation, storage and effects of trainer events.

The trainer sends the same event objects it writes to `<run_dir>/events.jsonl`
(docs/architecture.md#where-a-jobs-progress-lives). Ingestion is idempotent, so a batch retried after a timeout, or the file read
again after a control-plane restart, changes nothing twice:
- every event is stored once in the job's stream (unique by content digest);
- `step` -> a metrics row per (attempt, step), the job's last step and latest metrics;
- `checkpoint` -> a checkpoint row per (attempt, step);
- `state` -> a transition when the lifecycle allows it (late or repeated states are kept as events only).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tgc_rl.control import db
from tgc_rl.control.states import JobState, can_transition
from tgc_rl.control.store import (
    JobNotFound,
    JobRow,
    JobStore,
    append_event,
    apply_transition,
    insert_ignoring_conflicts,
)
from tgc_rl.run_layout import (
    EVENTS_FILE,
    CheckpointEvent,
    EventError,
    OtherEvent,
    StateEvent,
    StepEvent,
    TrainerEvent,
    parse_event,
)

__all__ = ["EventError", "IngestResult", "ingest", "normalize_event", "read_run_dir_events"]

Event = TrainerEvent | OtherEvent


def normalize_event(ev: Any, index: int = 0) -> Event:
    """A trainer event checked against the contract (tgc_rl/run_layout.py); unknown types are kept as
    OtherEvent (stored and counted, never applied). Raises EventError naming the field."""
    return parse_event(ev, index)


@dataclass
class IngestResult:
    stored: list[Event]  # the events that were new (not seen before)
    job: JobRow


def ingest(store: JobStore, job_id: str, attempt: int, events: Iterable[Event]) -> IngestResult:
    """Store a batch of (normalized) trainer events for one attempt and apply their effects."""
    stored: list[Event] = []
    with store.write() as conn:
        row = conn.execute(sa.select(db.jobs).where(db.jobs.c.id == job_id)).first()
        if row is None:
            raise JobNotFound(job_id)
        job = JobRow.from_row(row)
        for ev in events:
            if not append_event(conn, job_id, attempt, ev.wire()):
                continue  # seen before
            stored.append(ev)
            if attempt == job.attempt:
                job = _apply(conn, job, ev)
        if attempt == job.attempt:
            conn.execute(db.jobs.update().where(db.jobs.c.id == job_id).values(reported_at=time.time()))
    return IngestResult(stored, job)


def _apply(conn: Connection, job: JobRow, ev: Event) -> JobRow:
    if isinstance(ev, StepEvent):
        metrics = json.dumps(ev.metrics, allow_nan=False)
        insert_ignoring_conflicts(
            conn,
            db.metrics,
            {
                "job_id": job.id,
                "attempt": job.attempt,
                "step": ev.step,
                "time": ev.time,
                "data": metrics,
            },
        )
        if job.step is None or ev.step >= job.step:
            conn.execute(
                db.jobs.update()
                .where(db.jobs.c.id == job.id)
                .values(step=ev.step, latest_metrics=metrics, updated_at=time.time())
            )
            job.step, job.latest_metrics = ev.step, dict(ev.metrics)
    elif isinstance(ev, CheckpointEvent):
        insert_ignoring_conflicts(
            conn,
            db.checkpoints,
            {
                "job_id": job.id,
                "attempt": job.attempt,
                "step": ev.step,
                "path": ev.path,
                "time": ev.time,
            },
        )
    elif isinstance(ev, StateEvent):
        if ev.step is not None and (job.step is None or ev.step > job.step):
            conn.execute(db.jobs.update().where(db.jobs.c.id == job.id).values(step=ev.step))
            job.step = ev.step
        if can_transition(job.state, ev.state):
            job = apply_transition(conn, job, ev.state, _reason(job, ev.state, ev.reason))
    return job


def _reason(job: JobRow, dst: JobState, trainer_reason: str) -> str:
    reason = trainer_reason or dst.value
    if dst == JobState.CANCELLED and job.cancel_reason and job.cancel_reason not in reason:
        reason = f"{job.cancel_reason} (trainer: {reason})"
    if dst in (JobState.CANCELLED, JobState.FAILED, JobState.SUCCEEDED) and job.step is not None:
        reason += f"; last step {job.step}"
    return reason


def read_run_dir_events(run_dir: str | None, max_bytes: int = 64 * 2**20) -> list[Event] | None:
    """The events the trainer wrote to `<run_dir>/events.jsonl`, or None where the file is not visible here.

    Malformed lines (a line cut by a crash, an event the contract refuses) are skipped.
    """
    if not run_dir:
        return None
    path = Path(run_dir) / EVENTS_FILE
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            raw = f.read()
    except OSError:
        return None
    out = []
    for i, line in enumerate(raw.splitlines()):
        try:
            out.append(normalize_event(json.loads(line), i))
        except (ValueError, EventError):
            continue
    return out


# -- queries over stored progress -----------------------------------------------------------------
@dataclass(frozen=True)
class EventRow:
    seq: int
    job_id: str
    attempt: int
    type: str
    time: float
    data: dict[str, Any]


def events_since(
    store: JobStore, job_id: str, after_seq: int = 0, limit: int = 500, types: list[str] | None = None
) -> list[EventRow]:
    query = (
        sa.select(db.events)
        .where(db.events.c.job_id == job_id, db.events.c.seq > after_seq)
        .order_by(db.events.c.seq)
        .limit(limit)
    )
    if types:
        query = query.where(db.events.c.type.in_(types))
    with store.read() as conn:
        return [
            EventRow(r.seq, r.job_id, r.attempt, r.type, r.time, json.loads(r.data))
            for r in conn.execute(query)
        ]


@dataclass(frozen=True)
class MetricRow:
    step: int
    attempt: int
    time: float
    metrics: dict[str, float | None]


def metric_rows(
    store: JobStore,
    job_id: str,
    since_step: int | None = None,
    attempt: int | None = None,
    limit: int = 10_000,
) -> list[MetricRow]:
    query = sa.select(db.metrics).where(db.metrics.c.job_id == job_id)
    if since_step is not None:
        query = query.where(db.metrics.c.step >= since_step)
    if attempt is not None:
        query = query.where(db.metrics.c.attempt == attempt)
    query = query.order_by(db.metrics.c.attempt, db.metrics.c.step).limit(limit)
    with store.read() as conn:
        return [MetricRow(r.step, r.attempt, r.time, json.loads(r.data)) for r in conn.execute(query)]


@dataclass(frozen=True)
class CheckpointRow:
    step: int
    attempt: int
    path: str
    time: float


def checkpoint_rows(store: JobStore, job_id: str) -> list[CheckpointRow]:
    query = (
        sa.select(db.checkpoints)
        .where(db.checkpoints.c.job_id == job_id)
        .order_by(db.checkpoints.c.attempt, db.checkpoints.c.step)
    )
    with store.read() as conn:
        return [CheckpointRow(r.step, r.attempt, r.path, r.time) for r in conn.execute(query)]
