"""`/v1/jobs`: submit, list, read, cancel, resume, and a job's metrics, events, logs, checkpoints and samples.

A tenant sees only its own jobs (another tenant's job is a 404, not a 403: its existence is not
revealed); an admin token sees all.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from fastapi import Path as FastApiPath
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse

from tgc_rl.config import MAX_PROMPTS_PER_STEP, JobSpec
from tgc_rl.control import progress, records
from tgc_rl.control.auth import current_principal
from tgc_rl.control.errors import ApiError
from tgc_rl.control.limits import RECONNECT_MS, HeldStreamingResponse
from tgc_rl.control.policy import PolicyError, check_spec
from tgc_rl.control.states import RESUMABLE, TERMINAL
from tgc_rl.control.store import IdempotencyConflict, InvalidTransition, JobRow
from tgc_rl.control.tokens import Principal
from tgc_rl.run_layout import checkpoint_step
from tgc_rl.trainer.traces import Selected, read_page
from tgc_rl.wire import (
    CancelRequest,
    CheckpointList,
    DryRunResult,
    ErrorBody,
    ErrorDetail,
    JobList,
    JobRecord,
    JobState,
    LogPage,
    MetricSeries,
    ResumeRequest,
    SamplePage,
)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
Caller = Annotated[Principal, Depends(current_principal)]
# Every number a client sends is typed and bounded here, so a value out of the database's range is a 422
# naming the parameter, never an overflow inside a query.
MAX_SEQ = 2**63 - 1
MAX_ATTEMPT = 1_000_000
JobId = Annotated[str, FastApiPath(max_length=64, description="The job's id (`job_...`).")]

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing, invalid or revoked token."},
    429: {"model": ErrorBody, "description": "A per-token or per-tenant limit; see Retry-After."},
    404: {"model": ErrorBody, "description": "No such job (or another tenant's)."},
    422: {"model": ErrorBody, "description": "Invalid input; `detail` names each bad field."},
}


# A spec valid by the published schema can still be refused: JSON Schema cannot state every rule.
_SPEC_REFUSED = (
    "Invalid spec; `detail` names each field. Besides the schema's own rules this covers rules the schema "
    "cannot express: cross-field rules (prompts_per_step a multiple of optim.mini_batches, an `eval` section "
    "that names its rows, length budgets within sampling.max_new_tokens, a random model's shape), the params "
    "of the named task (`tgc schema --task NAME`), and this server's policy (privileges: custom code, host "
    "paths, an unconfined sandbox, custom resources; limits: steps, replicas, sizes; only your own datasets)."
)


def _cp(request: Request):
    return request.app.state.cp


def _own_job(request: Request, job_id: str, caller: Principal) -> JobRow:
    job = _cp(request).store.get(job_id, tenant=None if caller.is_admin else caller.tenant)
    if job is None:
        raise ApiError(404, f"no job {job_id!r}")
    return job


# -- submit ---------------------------------------------------------------------------------------
@router.post(
    "",
    status_code=201,
    response_model=JobRecord | DryRunResult,
    responses={
        **_ERRORS,
        200: {
            "model": JobRecord | DryRunResult,
            "description": "Dry run, or a replay of an earlier request with the same "
            "Idempotency-Key (the original job).",
        },
        409: {"model": ErrorBody, "description": "Idempotency-Key reused with a different spec."},
        413: {"model": ErrorBody, "description": "Request body too large."},
        422: {"model": ErrorBody, "description": _SPEC_REFUSED},
    },
    summary="Submit a job",
)
def submit_job(
    request: Request,
    response: Response,
    caller: Caller,
    # parse 1 of 3 (docs/architecture.md): a tenant's spec, a trust boundary, validated whole here
    spec: Annotated[JobSpec, Body(description="The job spec, the same schema as a YAML job file.")],
    dry_run: Annotated[
        bool, Query(description="Only validate (schema and server policy); store nothing.")
    ] = False,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=255,
            description="Retries with the same key return the job the first request created.",
        ),
    ] = None,
) -> JobRecord | DryRunResult:
    cp = _cp(request)
    try:
        owner = None if caller.is_admin else caller.tenant
        grants = check_spec(
            spec, cp.settings, caller.is_admin, lambda ds: cp.datasets.get(ds, owner) is not None
        )
    except PolicyError as e:
        cp.telemetry.rejections.labels("policy").inc()
        raise ApiError(
            422,
            f"job spec refused by this server: {e}",
            [ErrorDetail(field=v.field, msg=v.msg, type="policy") for v in e.violations],
        ) from None
    data = spec.to_dict()
    if dry_run:
        response.status_code = 200
        return DryRunResult(spec=data)
    try:
        job, created = cp.store.create(caller.tenant, data, idempotency_key, grants)
    except IdempotencyConflict as e:
        raise ApiError(409, str(e)) from None
    if created:
        cp.telemetry.submissions.labels(caller.tenant).inc()
        cp.wake_scheduler()
    else:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return records.job_record(job)


# -- read -----------------------------------------------------------------------------------------
@router.get(
    "",
    response_model=JobList,
    responses={
        **_ERRORS,
        403: {"model": ErrorBody, "description": "`tenant` names another tenant (admin tokens only)."},
    },
    summary="List jobs, newest first",
)
def list_jobs(
    request: Request,
    caller: Caller,
    state: Annotated[list[JobState] | None, Query(description="Only jobs in these states.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        int | None, Query(ge=0, le=MAX_SEQ, description="`next_cursor` of the previous page.")
    ] = None,
    tenant: Annotated[str | None, Query(max_length=64, description="Admin only: one tenant's jobs.")] = None,
) -> JobList:
    if tenant is not None and not caller.is_admin and tenant != caller.tenant:
        raise ApiError(403, "only admin tokens can list other tenants' jobs")
    scope = tenant if (caller.is_admin or tenant) else caller.tenant
    jobs = _cp(request).store.list(scope, state, limit + 1, cursor)
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return JobList(
        jobs=[records.job_record(j) for j in jobs], next_cursor=str(jobs[-1].seq) if more else None
    )


@router.get("/{job_id}", response_model=JobRecord, responses=_ERRORS, summary="Get a job")
def get_job(request: Request, caller: Caller, job_id: JobId) -> JobRecord:
    return records.job_record(_own_job(request, job_id, caller))


# -- control --------------------------------------------------------------------------------------
@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobRecord,
    responses={**_ERRORS, 409: {"model": ErrorBody, "description": "The job already ended."}},
    summary="Cancel a job (graceful: checkpoint at the next step boundary, then stop)",
)
def cancel_job(
    request: Request, caller: Caller, job_id: JobId, body: Annotated[CancelRequest | None, Body()] = None
) -> JobRecord:
    job = _own_job(request, job_id, caller)
    cp = _cp(request)
    reason = (body or CancelRequest()).reason
    try:
        job = cp.store.request_cancel(job.id, reason)
    except InvalidTransition as e:
        raise ApiError(409, str(e)) from None
    if job.state in TERMINAL:
        cp.telemetry.job_finished(job.state)
    cp.wake_scheduler()
    return records.job_record(job)


@router.post(
    "/{job_id}/resume",
    status_code=202,
    response_model=JobRecord,
    responses={
        **_ERRORS,
        409: {"model": ErrorBody, "description": "Not resumable (running, succeeded, no checkpoint)."},
    },
    summary="Resume a failed or cancelled job from a checkpoint (a new attempt)",
)
def resume_job(
    request: Request, caller: Caller, job_id: JobId, body: Annotated[ResumeRequest | None, Body()] = None
) -> JobRecord:
    job = _own_job(request, job_id, caller)
    cp = _cp(request)
    body = body or ResumeRequest()
    if job.state not in RESUMABLE:
        raise ApiError(409, f"job {job.id} is {job.state}; only failed or cancelled jobs can be resumed")
    ckpts = progress.checkpoint_rows(cp.store, job.id)
    if not ckpts:
        raise ApiError(409, f"job {job.id} has no checkpoint to resume from")
    if body.checkpoint is None:
        chosen = max(ckpts, key=lambda c: (c.step, c.attempt))
    else:
        step = checkpoint_step(body.checkpoint)
        matches = [c for c in ckpts if (step is not None and c.step == step) or c.path == body.checkpoint]
        if not matches:
            raise ApiError(
                422,
                f"checkpoint: {body.checkpoint!r} is not one of this job's checkpoints",
                [ErrorDetail(field="checkpoint", msg="use a path or step_<N> from GET .../checkpoints")],
            )
        chosen = max(matches, key=lambda c: c.attempt)
    try:
        job = cp.store.resume(job.id, chosen.path, body.reason)
    except InvalidTransition as e:
        raise ApiError(409, str(e)) from None
    cp.wake_scheduler()
    return records.job_record(job)


# -- progress -------------------------------------------------------------------------------------
@router.get("/{job_id}/metrics", response_model=MetricSeries, responses=_ERRORS, summary="Per-step metrics")
def job_metrics(
    request: Request,
    caller: Caller,
    job_id: JobId,
    since_step: Annotated[int | None, Query(ge=0, le=MAX_SEQ, description="Only steps >= this.")] = None,
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_ATTEMPT, description="Only this attempt (default: all).")
    ] = None,
) -> MetricSeries:
    job = _own_job(request, job_id, caller)
    rows = progress.metric_rows(_cp(request).store, job.id, since_step, attempt)
    return MetricSeries(job_id=job.id, points=[records.metric_point(r) for r in rows])


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, responses=_ERRORS, summary="Checkpoints")
def job_checkpoints(request: Request, caller: Caller, job_id: JobId) -> CheckpointList:
    job = _own_job(request, job_id, caller)
    out = []
    for c in progress.checkpoint_rows(_cp(request).store, job.id):
        try:
            exists: bool | None = Path(c.path).is_dir()
        except OSError:
            exists = None
        out.append(records.checkpoint_info(c, exists))
    return CheckpointList(job_id=job.id, checkpoints=out)


@router.get(
    "/{job_id}/samples",
    response_model=SamplePage,
    responses=_ERRORS,
    summary="Rollout traces: sampled trajectories of training steps (prompt, response, reward, advantage)",
)
def job_samples(
    request: Request,
    caller: Caller,
    job_id: JobId,
    step: Annotated[int | None, Query(ge=0, le=MAX_SEQ, description="Only this step.")] = None,
    group: Annotated[
        int | None, Query(ge=0, le=MAX_PROMPTS_PER_STEP, description="Only this group of each step.")
    ] = None,
    selected: Annotated[
        Selected | None, Query(description="Only those kept for this reason (e.g. `worst` of their group).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
    cursor: Annotated[
        str | None,
        Query(
            max_length=64,
            pattern=r"^\d{1,19}\.\d{1,10}\.\d{1,10}$",
            description="`next_cursor` of the previous page.",
        ),
    ] = None,
) -> SamplePage:
    job = _own_job(request, job_id, caller)
    if not job.run_dir:  # not started: nothing sampled yet
        return SamplePage(job_id=job.id, samples=[])
    after = None
    if cursor:
        s, g, i = (int(x) for x in cursor.split("."))
        after = (s, g, i)
    # the current attempt's run directory; files are read a line at a time with a cap per line, never a symlink
    page = read_page(Path(job.run_dir), step=step, group=group, selected=selected, after=after, limit=limit)
    last = page.records[-1] if page.more else None
    return SamplePage(
        job_id=job.id,
        samples=page.records,
        next_cursor=f"{last.step}.{last.group}.{last.index}" if last else None,
        last_step=page.last_step,
    )


@router.get(
    "/{job_id}/logs",
    response_model=LogPage,
    responses={
        **_ERRORS,
        200: {
            "content": {"application/json": {}, "text/plain": {}},
            "description": "trainer: JSON page of log lines; driver: the Ray driver's output.",
        },
    },
    summary="Log lines (reported by the trainer), or the Ray driver's stdout/stderr",
)
def job_logs(
    request: Request,
    caller: Caller,
    job_id: JobId,
    since: Annotated[int, Query(ge=0, le=MAX_SEQ, description="`next` of the previous page.")] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
    source: Annotated[Literal["trainer", "driver"], Query()] = "trainer",
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_ATTEMPT, description="driver: which attempt (default: current).")
    ] = None,
):
    job = _own_job(request, job_id, caller)
    cp = _cp(request)
    if source == "driver":
        text = cp.driver_log(job, attempt or job.attempt)
        return PlainTextResponse(text or "")
    rows = progress.events_since(cp.store, job.id, since, limit, types=["log"])
    return LogPage(
        job_id=job.id, lines=[records.log_line(r) for r in rows], next=rows[-1].seq if rows else since
    )


@router.get(
    "/{job_id}/events",
    responses={
        **_ERRORS,
        200: {
            "content": {"text/event-stream": {}},
            "description": "Server-sent events; each `data:` is a JobEvent, `id:` its seq. "
            "The stream ends with an `end` event once the job has ended, or earlier with a `retry:` hint "
            "at the server's stream lifetime (reconnect with Last-Event-ID).",
        },
    },
    summary="Stream a job's events (state changes, step metrics, checkpoints, log lines)",
)
async def job_events(
    request: Request,
    caller: Caller,
    job_id: JobId,
    since: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Only events after this seq.")] = 0,
    follow: Annotated[bool, Query(description="Keep streaming until the job ends.")] = True,
    last_event_id: Annotated[
        int | None,
        Header(alias="Last-Event-ID", ge=0, le=MAX_SEQ, description="The `id:` of the last event received."),
    ] = None,
) -> StreamingResponse:
    job = await run_in_threadpool(_own_job, request, job_id, caller)
    if last_event_id is not None:
        since = max(since, last_event_id)
    cp = _cp(request)
    if not cp.streams.acquire(caller.tenant):
        raise ApiError(
            429,
            f"tenant {caller.tenant!r} already has {cp.streams.limit} event streams open, the most "
            "this server allows (max_streams_per_tenant); close one, or poll GET /v1/jobs/{id}",
            headers={"Retry-After": "5"},
        )
    return HeldStreamingResponse(
        _event_stream(cp, job.id, since, follow, caller.token_id),
        release=lambda: cp.streams.release(caller.tenant),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _sse(event: str, data: str, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    event = " ".join(event.splitlines())  # a trainer's event type must not add lines (fields) of its own
    return f"{head}event: {event}\ndata: {data}\n\n"


async def _event_stream(cp, job_id: str, since: int, follow: bool, token_id: str) -> AsyncIterator[str]:
    # Re-read a window below the cursor: with PostgreSQL a lower seq can commit after a higher one.
    overlap = 64 if cp.store.engine.dialect.name != "sqlite" else 0
    cursor, sent = since, deque[int](maxlen=4096)
    sent_set: set[int] = set()
    opened = last_write = last_auth = time.monotonic()
    while True:
        now = time.monotonic()
        if now - last_auth >= cp.settings.stream_reauth_s:
            last_auth = now
            if not await run_in_threadpool(cp.token_store.is_active, token_id):
                yield ": the token of this stream was revoked\n\n"
                return
        if now - opened >= cp.settings.stream_max_s:
            # SSE's reconnection hint; the client resumes with Last-Event-ID (tgc_rl/sdk: Job.stream).
            yield f": stream lifetime reached (stream_max_s); reconnect with Last-Event-ID\nretry: {RECONNECT_MS}\n\n"
            return
        rows = await run_in_threadpool(
            progress.events_since, cp.store, job_id, max(since, cursor - overlap), 500
        )
        fresh = [r for r in rows if r.seq not in sent_set]
        for r in fresh:
            if len(sent) == sent.maxlen:
                sent_set.discard(sent[0])
            sent.append(r.seq)
            sent_set.add(r.seq)
            cursor = max(cursor, r.seq)
            yield _sse(r.type, records.job_event(r).model_dump_json(), r.seq)
            last_write = time.monotonic()
        if len(rows) >= 500:
            continue
        job = await run_in_threadpool(cp.store.get, job_id)
        if job is None or not follow or job.state in TERMINAL:
            # One more read so that events stored just before the end are not cut off.
            tail = await run_in_threadpool(progress.events_since, cp.store, job_id, cursor, 500)
            for r in tail:
                yield _sse(r.type, records.job_event(r).model_dump_json(), r.seq)
            yield _sse(
                "end",
                json.dumps(
                    {
                        "job_id": job_id,
                        "state": job.state.value if job else None,
                        "reason": job.reason if job else "deleted",
                    }
                ),
            )
            return
        if time.monotonic() - last_write > 15:
            yield ": keep-alive\n\n"  # a comment line: keeps proxies from closing an idle stream
            last_write = time.monotonic()
        await asyncio.sleep(cp.settings.sse_poll_s)
