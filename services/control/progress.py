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
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from services.control import db
from services.control.states import JobState, can_transition
from services.control.store import (
    JobNotFound,
    JobRow,
    JobStore,
    append_event,
    apply_transition,
    insert_ignoring_conflicts,
)
from services.run_layout import json_safe

TRAINER_STATES = frozenset({JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
MAX_LOG_MESSAGE = 8192
MAX_METRICS_PER_STEP = 512


class EventError(ValueError):
    """A malformed trainer event; the message names the field."""


def _int(ev: dict[str, Any], key: str, index: int) -> int:
    v = ev.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise EventError(f"events[{index}].{key}: must be a non-negative integer, got {v!r}")
    return v


def _finite_or_none(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None  # JSON has no NaN/inf; they become null


def normalize_event(ev: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """Check the fields a known event type must carry; unknown types pass through unchanged."""
    t = ev.get("type")
    if not isinstance(t, str) or not t:
        raise EventError(f"events[{index}].type: must be a non-empty string")
    tm = ev.get("time")
    if isinstance(tm, bool) or not isinstance(tm, int | float) or not math.isfinite(tm):
        raise EventError(f"events[{index}].time: must be a finite number (unix seconds)")
    out = dict(ev)
    out.setdefault("source", "trainer")  # state events with source=control are the record's transitions
    if t == "state":
        try:
            state = JobState(str(ev.get("state")))
        except ValueError:
            raise EventError(
                f"events[{index}].state: must be one of {', '.join(s.value for s in TRAINER_STATES)}"
            ) from None
        if state not in TRAINER_STATES:
            raise EventError(f"events[{index}].state: a trainer cannot report {state.value!r}")
        out["reason"] = str(ev.get("reason") or "")[:MAX_LOG_MESSAGE]
        if ev.get("step") is not None:
            _int(ev, "step", index)
    elif t == "step":
        _int(ev, "step", index)
        metrics = ev.get("metrics")
        if not isinstance(metrics, dict) or len(metrics) > MAX_METRICS_PER_STEP:
            raise EventError(
                f"events[{index}].metrics: must be a mapping of at most {MAX_METRICS_PER_STEP} names"
            )
        clean: dict[str, float | None] = {}
        for k, v in metrics.items():
            if v is None:
                clean[str(k)] = None
            elif isinstance(v, bool) or not isinstance(v, int | float):
                raise EventError(f"events[{index}].metrics.{k}: must be a number, got {type(v).__name__}")
            else:
                clean[str(k)] = _finite_or_none(v)
        out["metrics"] = clean
    elif t == "checkpoint":
        _int(ev, "step", index)
        if not isinstance(ev.get("path"), str) or not ev["path"]:
            raise EventError(f"events[{index}].path: must be the checkpoint directory (a non-empty string)")
    elif t == "log":
        msg = ev.get("message", ev.get("line", ev.get("text", "")))
        out["message"] = str(msg)[:MAX_LOG_MESSAGE]
        out["level"] = str(ev.get("level", "info"))[:16]
    return json_safe(out)


@dataclass
class IngestResult:
    stored: list[dict[str, Any]]  # the events that were new (not seen before)
    job: JobRow


def ingest(store: JobStore, job_id: str, attempt: int, events: Iterable[dict[str, Any]]) -> IngestResult:
    """Store a batch of (normalized) trainer events for one attempt and apply their effects."""
    stored: list[dict[str, Any]] = []
    with store.write() as conn:
        row = conn.execute(sa.select(db.jobs).where(db.jobs.c.id == job_id)).first()
        if row is None:
            raise JobNotFound(job_id)
        job = JobRow.from_row(row)
        for ev in events:
            if not append_event(conn, job_id, attempt, ev):
                continue  # seen before
            stored.append(ev)
            if attempt == job.attempt:
                job = _apply(conn, job, ev)
        if attempt == job.attempt:
            conn.execute(db.jobs.update().where(db.jobs.c.id == job_id).values(reported_at=time.time()))
    return IngestResult(stored, job)


def _apply(conn: Connection, job: JobRow, ev: dict[str, Any]) -> JobRow:
    t = ev["type"]
    if t == "step":
        step = ev["step"]
        insert_ignoring_conflicts(conn, db.metrics, {
            "job_id": job.id, "attempt": job.attempt, "step": step, "time": ev["time"],
            "data": json.dumps(ev["metrics"], allow_nan=False),
        })  # fmt: skip
        if job.step is None or step >= job.step:
            conn.execute(
                db.jobs.update()
                .where(db.jobs.c.id == job.id)
                .values(
                    step=step,
                    latest_metrics=json.dumps(ev["metrics"], allow_nan=False),
                    updated_at=time.time(),
                )
            )
            job.step, job.latest_metrics = step, ev["metrics"]
    elif t == "checkpoint":
        insert_ignoring_conflicts(conn, db.checkpoints, {
            "job_id": job.id, "attempt": job.attempt, "step": ev["step"], "path": ev["path"], "time": ev["time"],
        })  # fmt: skip
    elif t == "state":
        dst = JobState(ev["state"])
        step = ev.get("step")
        if step is not None and (job.step is None or step > job.step):
            conn.execute(db.jobs.update().where(db.jobs.c.id == job.id).values(step=step))
            job.step = step
        if can_transition(job.state, dst):
            job = apply_transition(conn, job, dst, _reason(job, dst, ev["reason"]))
    return job


def _reason(job: JobRow, dst: JobState, trainer_reason: str) -> str:
    reason = trainer_reason or dst.value
    if dst == JobState.CANCELLED and job.cancel_reason and job.cancel_reason not in reason:
        reason = f"{job.cancel_reason} (trainer: {reason})"
    if dst in (JobState.CANCELLED, JobState.FAILED, JobState.SUCCEEDED) and job.step is not None:
        reason += f"; last step {job.step}"
    return reason


def read_run_dir_events(run_dir: str | None, max_bytes: int = 64 * 2**20) -> list[dict[str, Any]] | None:
    """The events the trainer wrote to `<run_dir>/events.jsonl`, or None where the file is not visible here.

    Malformed lines (a line cut by a crash) are skipped.
    """
    if not run_dir:
        return None
    path = Path(run_dir) / "events.jsonl"
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            raw = f.read()
    except OSError:
        return None
    out = []
    for i, line in enumerate(raw.splitlines()):
        try:
            ev = json.loads(line)
            if isinstance(ev, dict):
                out.append(normalize_event(ev, i))
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
