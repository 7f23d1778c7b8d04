"""Stored rows -> wire models."""

from __future__ import annotations

from datetime import UTC, datetime

from tgc_rl.control.progress import CheckpointRow, EventRow, MetricRow
from tgc_rl.control.store import JobRow
from tgc_rl.wire import CheckpointInfo, JobEvent, JobRecord, LogLine, MetricPoint, Transition


def ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, tz=UTC)


def job_record(job: JobRow) -> JobRecord:
    return JobRecord(
        id=job.id,
        name=job.name,
        tenant=job.tenant,
        state=job.state,
        reason=job.reason,
        spec=job.spec,
        created_at=ts(job.created_at),
        updated_at=ts(job.updated_at),
        started_at=ts(job.started_at),
        finished_at=ts(job.finished_at),
        attempt=job.attempt,
        step=job.step,
        total_steps=int(job.spec.get("steps", 0)),
        latest_metrics=job.latest_metrics,
        cancel_requested=job.cancel_requested_at is not None,
        cancel_reason=job.cancel_reason,
        hard_stopped=job.hard_stopped,
        ray_submission_id=job.ray_submission_id,
        run_dir=job.run_dir,
        driver_running=bool(job.ray_submission_id) and not job.ray_done,
        resume_from=job.resume_from,
        transitions=[
            Transition(
                state=t.to_state, previous=t.from_state, reason=t.reason, time=ts(t.time), attempt=t.attempt
            )
            for t in job.transitions
        ],
    )


def metric_point(m: MetricRow) -> MetricPoint:
    return MetricPoint(step=m.step, attempt=m.attempt, time=ts(m.time), metrics=m.metrics)


def checkpoint_info(c: CheckpointRow, exists: bool | None) -> CheckpointInfo:
    return CheckpointInfo(step=c.step, attempt=c.attempt, path=c.path, time=ts(c.time), exists=exists)


def job_event(e: EventRow) -> JobEvent:
    return JobEvent(seq=e.seq, job_id=e.job_id, attempt=e.attempt, type=e.type, time=ts(e.time), data=e.data)


def log_line(e: EventRow) -> LogLine:
    return LogLine(
        seq=e.seq,
        attempt=e.attempt,
        time=ts(e.time),
        level=str(e.data.get("level", "info")),
        message=str(e.data.get("message", "")),
    )
