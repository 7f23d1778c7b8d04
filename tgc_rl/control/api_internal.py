"""`/v1/internal`: where trainers report progress, authenticated by their per-attempt job token.

The answer tells the trainer whether to stop gracefully (a cancel was requested, or the control
plane already ended the job, e.g. after a hard stop it did not notice).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from tgc_rl.control import progress
from tgc_rl.control.auth import reporting_job
from tgc_rl.control.errors import ApiError
from tgc_rl.control.states import TERMINAL
from tgc_rl.control.store import JobRow
from tgc_rl.run_layout import OtherEvent, StateEvent
from tgc_rl.wire import ErrorBody, ErrorDetail, EventAck, EventBatch

router = APIRouter(prefix="/v1/internal", tags=["internal"])


@router.post(
    "/jobs/{job_id}/events",
    response_model=EventAck,
    responses={401: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    summary="Trainer reports (state, step, checkpoint, log events); answers whether to cancel",
)
def report_events(
    request: Request, job_id: str, batch: EventBatch, job: Annotated[JobRow, Depends(reporting_job)]
) -> EventAck:
    cp = request.app.state.cp
    try:
        events = [progress.normalize_event(ev.model_dump(), i) for i, ev in enumerate(batch.events)]
    except progress.EventError as e:
        field = str(e).split(":", 1)[0]
        raise ApiError(422, str(e), [ErrorDetail(field=field, msg=str(e), type="event")]) from None
    before = job.state
    result = progress.ingest(cp.store, job.id, job.attempt, events)
    for ev in result.stored:
        cp.telemetry.trainer_events.labels("other" if isinstance(ev, OtherEvent) else ev.type).inc()
    after = result.job
    if after.state != before and after.state in TERMINAL:
        cp.telemetry.job_finished(after.state)
    if after.state in TERMINAL:
        reported_end = any(isinstance(ev, StateEvent) and ev.state in TERMINAL for ev in events)
        if not reported_end:
            return EventAck(
                cancel=True, reason=f"the job already ended ({after.state.value}): {after.reason}"
            )
        return EventAck(cancel=False, reason=None)
    if after.cancel_requested_at is not None:
        return EventAck(cancel=True, reason=after.cancel_reason)
    return EventAck(cancel=False, reason=None)
