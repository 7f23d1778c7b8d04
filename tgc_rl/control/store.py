"""Job records in SQL: creation (with idempotency keys), queries, and state transitions.

Every transition is a compare-and-set on the job's current state, stored with its time and reason in
`transitions`, and appended to the job's event stream, all in one transaction.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from tgc_rl.control import db
from tgc_rl.control.states import ACTIVE, TERMINAL, JobState, can_transition


class StoreError(Exception):
    """Base of the store's domain errors (the API maps them to HTTP statuses)."""


class IdempotencyConflict(StoreError):
    """The Idempotency-Key was used before with a different request body."""


class JobNotFound(StoreError):
    pass


class InvalidTransition(StoreError):
    pass


class QueueFull(StoreError):
    """The tenant already has as many queued jobs as the server allows (`max_queued_jobs`)."""


@dataclass
class JobRow:
    seq: int
    id: str
    tenant: str
    name: str
    state: JobState
    reason: str
    spec: dict[str, Any]
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    attempt: int
    step: int | None
    latest_metrics: dict[str, float | None]
    cancel_requested_at: float | None
    cancel_reason: str | None
    hard_stopped: bool
    ray_submission_id: str | None
    ray_done: bool
    reported_at: float | None
    run_dir: str | None
    resume_from: str | None
    job_token_hash: str | None
    idempotency_key: str | None
    request_digest: str | None
    grants: str  # comma-separated privileges granted at submission (tgc_rl.tasks.grants)
    transitions: list[TransitionRow] = field(default_factory=list)

    @classmethod
    def from_row(cls, r: sa.Row) -> JobRow:
        m = dict(r._mapping)
        m["state"] = JobState(m["state"])
        m["spec"] = json.loads(m["spec"])
        m["latest_metrics"] = json.loads(m["latest_metrics"]) if m["latest_metrics"] else {}
        m["hard_stopped"] = bool(m["hard_stopped"])
        m["ray_done"] = bool(m["ray_done"])
        return cls(**m)


@dataclass(frozen=True)
class TransitionRow:
    job_id: str
    attempt: int
    from_state: JobState | None
    to_state: JobState
    reason: str
    time: float


@dataclass(frozen=True)
class ExpiredJob:
    """A job that retention deleted."""

    id: str
    tenant: str


def new_job_id() -> str:
    return "job-" + secrets.token_hex(6)


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def request_digest(data: Any) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def insert_ignoring_conflicts(conn: Connection, table: sa.Table, values: dict[str, Any]) -> bool:
    """INSERT unless a unique constraint already holds that row; True when a row was inserted."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]  # same API, other dialect
    # RETURNING, not rowcount: drivers differ in what rowcount says for INSERT ... ON CONFLICT (psycopg: -1).
    stmt = insert(table).values(**values).on_conflict_do_nothing().returning(*table.primary_key.columns)
    return conn.execute(stmt).first() is not None


def append_event(conn: Connection, job_id: str, attempt: int, data: dict[str, Any]) -> bool:
    """Add an event to the job's stream, once: a repeated event (same content) is ignored."""
    text = canonical_json(data)
    return insert_ignoring_conflicts(
        conn,
        db.events,
        {
            "job_id": job_id,
            "attempt": attempt,
            "type": str(data["type"]),
            "time": float(data["time"]),
            "data": text,
            "digest": hashlib.sha256(text.encode()).hexdigest(),
        },
    )


def apply_transition(
    conn: Connection, job: JobRow, dst: JobState, reason: str, now: float | None = None, **fields: Any
) -> JobRow:
    """Move `job` to `dst` if the job is still in the state the caller read (compare-and-set)."""
    if not can_transition(job.state, dst):
        raise InvalidTransition(f"job {job.id} cannot go from {job.state} to {dst}")
    now = time.time() if now is None else now
    values: dict[str, Any] = {"state": dst.value, "reason": reason, "updated_at": now, **fields}
    if dst in TERMINAL:
        values.setdefault("finished_at", now)
    res = conn.execute(
        db.jobs.update()
        .where(db.jobs.c.id == job.id, db.jobs.c.state == job.state.value, db.jobs.c.attempt == job.attempt)
        .values(**values)
    )
    if res.rowcount != 1:
        raise InvalidTransition(f"job {job.id} changed state concurrently (expected {job.state})")
    attempt = fields.get("attempt", job.attempt)
    conn.execute(
        db.transitions.insert().values(
            job_id=job.id,
            attempt=attempt,
            from_state=job.state.value,
            to_state=dst.value,
            reason=reason,
            time=now,
        )
    )
    append_event(
        conn,
        job.id,
        attempt,
        {
            "type": "state",
            "time": now,
            "state": dst.value,
            "previous": job.state.value,
            "reason": reason,
            "step": fields.get("step", job.step),
            "source": "control",
        },
    )
    row = conn.execute(sa.select(db.jobs).where(db.jobs.c.id == job.id)).one()
    return JobRow.from_row(row)


class JobStore:
    def __init__(self, engine: Engine, max_queued: int = 0):
        self.engine = engine
        self.max_queued = max_queued  # per tenant; 0: no limit

    def _check_queue(self, conn: Connection, tenant: str) -> None:
        """Inside the write transaction that queues a job, so that concurrent submissions cannot overshoot:
        SQLite's write lock serializes them; on PostgreSQL a per-tenant advisory lock does, to the commit."""
        if not self.max_queued:
            return
        if conn.dialect.name == "postgresql":
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"tgc-queue:{tenant}"}
            )
        queued = conn.execute(
            sa.select(sa.func.count())
            .select_from(db.jobs)
            .where(db.jobs.c.tenant == tenant, db.jobs.c.state == JobState.QUEUED.value)
        ).scalar_one()
        if queued >= self.max_queued:
            raise QueueFull(
                f"tenant {tenant!r} already has {queued} queued jobs, the most this server allows "
                f"(max_queued_jobs = {self.max_queued}); retry once some have started, or cancel queued "
                "ones you no longer need (`tgc jobs --state queued`, `tgc cancel ID`)"
            )

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction (takes SQLite's write lock up front; see db.make_engine)."""
        with self.engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    def ping(self) -> None:
        with self.read() as conn:
            conn.execute(sa.text("SELECT 1"))

    # -- create -----------------------------------------------------------------------------------
    def create(
        self, tenant: str, spec: dict[str, Any], idempotency_key: str | None = None, grants: str = ""
    ) -> tuple[JobRow, bool]:
        """Store a new queued job; with a known Idempotency-Key return the existing job instead.

        Returns (job, created). Raises IdempotencyConflict if the key was used with another spec.
        """
        digest = request_digest(spec)
        if idempotency_key is not None:
            existing = self._by_idempotency_key(tenant, idempotency_key)
            if existing is not None:
                return self._replay(existing, digest), False
        now = time.time()
        job_id = new_job_id()
        try:
            with self.write() as conn:
                self._check_queue(conn, tenant)
                conn.execute(
                    db.jobs.insert().values(
                        id=job_id,
                        tenant=tenant,
                        name=spec.get("name", "tgc-job"),
                        state=JobState.QUEUED.value,
                        reason="accepted",
                        spec=canonical_json(spec),
                        created_at=now,
                        updated_at=now,
                        attempt=1,
                        hard_stopped=False,
                        ray_done=True,
                        idempotency_key=idempotency_key,
                        request_digest=digest,
                        grants=grants,
                    )
                )
                conn.execute(
                    db.transitions.insert().values(
                        job_id=job_id,
                        attempt=1,
                        from_state=None,
                        to_state=JobState.QUEUED.value,
                        reason="accepted",
                        time=now,
                    )
                )
                append_event(
                    conn,
                    job_id,
                    1,
                    {
                        "type": "state",
                        "time": now,
                        "state": JobState.QUEUED.value,
                        "previous": None,
                        "reason": "accepted",
                        "step": None,
                        "source": "control",
                    },
                )
                job = JobRow.from_row(conn.execute(sa.select(db.jobs).where(db.jobs.c.id == job_id)).one())
        except IntegrityError:
            # Two requests with the same key raced; the other one won: answer with its job.
            existing = self._by_idempotency_key(tenant, idempotency_key) if idempotency_key else None
            if existing is None:
                raise
            return self._replay(existing, digest), False
        return self._with_transitions(job), True

    def _by_idempotency_key(self, tenant: str, key: str) -> JobRow | None:
        with self.read() as conn:
            row = conn.execute(
                sa.select(db.jobs).where(db.jobs.c.tenant == tenant, db.jobs.c.idempotency_key == key)
            ).first()
        return None if row is None else self._with_transitions(JobRow.from_row(row))

    @staticmethod
    def _replay(existing: JobRow, digest: str) -> JobRow:
        if existing.request_digest != digest:
            raise IdempotencyConflict(
                f"Idempotency-Key {existing.idempotency_key!r} was already used for job {existing.id} with a "
                "different spec; use a new key for a new job"
            )
        return existing

    # -- read -------------------------------------------------------------------------------------
    def get(self, job_id: str, tenant: str | None = None) -> JobRow | None:
        """The job, or None if it does not exist or belongs to another tenant (when `tenant` is given)."""
        query = sa.select(db.jobs).where(db.jobs.c.id == job_id)
        if tenant is not None:
            query = query.where(db.jobs.c.tenant == tenant)
        with self.read() as conn:
            row = conn.execute(query).first()
        return None if row is None else self._with_transitions(JobRow.from_row(row))

    def list(
        self,
        tenant: str | None = None,
        states: list[JobState] | None = None,
        limit: int = 50,
        before_seq: int | None = None,
    ) -> builtins.list[JobRow]:
        """Newest first; `before_seq` pages to older jobs."""
        query = sa.select(db.jobs).order_by(db.jobs.c.seq.desc()).limit(limit)
        if tenant is not None:
            query = query.where(db.jobs.c.tenant == tenant)
        if states:
            query = query.where(db.jobs.c.state.in_([s.value for s in states]))
        if before_seq is not None:
            query = query.where(db.jobs.c.seq < before_seq)
        with self.read() as conn:
            jobs = [JobRow.from_row(r) for r in conn.execute(query)]
            by_id = self._transitions(conn, [j.id for j in jobs])
        for j in jobs:
            j.transitions = by_id.get(j.id, [])
        return jobs

    def _with_transitions(self, job: JobRow) -> JobRow:
        with self.read() as conn:
            job.transitions = self._transitions(conn, [job.id]).get(job.id, [])
        return job

    @staticmethod
    def _transitions(
        conn: Connection, job_ids: builtins.list[str]
    ) -> dict[str, builtins.list[TransitionRow]]:
        if not job_ids:
            return {}
        rows = conn.execute(
            sa.select(db.transitions)
            .where(db.transitions.c.job_id.in_(job_ids))
            .order_by(db.transitions.c.id)
        )
        out: dict[str, list[TransitionRow]] = {}
        for r in rows:
            out.setdefault(r.job_id, []).append(
                TransitionRow(
                    r.job_id,
                    r.attempt,
                    JobState(r.from_state) if r.from_state else None,
                    JobState(r.to_state),
                    r.reason,
                    r.time,
                )
            )
        return out

    def queued(self) -> builtins.list[JobRow]:
        """Queued jobs, oldest first (admission is FIFO per tenant)."""
        with self.read() as conn:
            rows = conn.execute(
                sa.select(db.jobs).where(db.jobs.c.state == JobState.QUEUED.value).order_by(db.jobs.c.seq)
            )
            return [JobRow.from_row(r) for r in rows]

    def active_count(self, tenant: str) -> int:
        """Jobs that hold cluster resources: starting/running, or ended but their Ray job is still alive."""
        with self.read() as conn:
            return conn.execute(
                sa.select(sa.func.count())
                .select_from(db.jobs)
                .where(
                    db.jobs.c.tenant == tenant,
                    sa.or_(
                        db.jobs.c.state.in_([s.value for s in ACTIVE]),
                        sa.and_(db.jobs.c.ray_submission_id.is_not(None), db.jobs.c.ray_done.is_(False)),
                    ),
                )
            ).scalar_one()

    def on_ray(self) -> builtins.list[JobRow]:
        """Jobs whose Ray job may still exist (submitted, not yet seen finished)."""
        with self.read() as conn:
            rows = conn.execute(
                sa.select(db.jobs)
                .where(db.jobs.c.ray_submission_id.is_not(None), db.jobs.c.ray_done.is_(False))
                .order_by(db.jobs.c.seq)
            )
            return [JobRow.from_row(r) for r in rows]

    def counts_by_state(self) -> dict[JobState, int]:
        with self.read() as conn:
            rows = conn.execute(sa.select(db.jobs.c.state, sa.func.count()).group_by(db.jobs.c.state))
            counts = {JobState(s): n for s, n in rows}
        return {s: counts.get(s, 0) for s in JobState}

    def active_jobs(self) -> builtins.list[JobRow]:
        with self.read() as conn:
            rows = conn.execute(sa.select(db.jobs).where(db.jobs.c.state.in_([s.value for s in ACTIVE])))
            return [JobRow.from_row(r) for r in rows]

    # -- change -----------------------------------------------------------------------------------
    def transition(
        self,
        job_id: str,
        dst: JobState,
        reason: str,
        expect: frozenset[JobState] | None = None,
        **fields: Any,
    ) -> JobRow:
        """Move the job to `dst`; `expect` restricts the states it may come from (else InvalidTransition)."""
        with self.write() as conn:
            row = conn.execute(sa.select(db.jobs).where(db.jobs.c.id == job_id)).first()
            if row is None:
                raise JobNotFound(job_id)
            job = JobRow.from_row(row)
            if expect is not None and job.state not in expect:
                raise InvalidTransition(f"job {job_id} is {job.state}, not one of {sorted(expect)}")
            job = apply_transition(conn, job, dst, reason, **fields)
        return self._with_transitions(job)

    def update(self, job_id: str, **fields: Any) -> None:
        with self.write() as conn:
            conn.execute(db.jobs.update().where(db.jobs.c.id == job_id).values(**fields))

    def log_event(self, job: JobRow, message: str, level: str = "info") -> None:
        """A log line from the control plane itself into the job's stream."""
        with self.write() as conn:
            append_event(
                conn,
                job.id,
                job.attempt,
                {
                    "type": "log",
                    "time": time.time(),
                    "level": level,
                    "message": message,
                    "source": "control",
                },
            )

    def request_cancel(self, job_id: str, reason: str) -> JobRow:
        """Queued jobs end at once; active ones get a cancel flag the trainer sees on its next report."""
        with self.write() as conn:
            row = conn.execute(sa.select(db.jobs).where(db.jobs.c.id == job_id)).first()
            if row is None:
                raise JobNotFound(job_id)
            job = JobRow.from_row(row)
            if job.state in TERMINAL:
                raise InvalidTransition(f"job {job_id} already ended ({job.state}); nothing to cancel")
            now = time.time()
            if job.state == JobState.QUEUED:
                apply_transition(
                    conn,
                    job,
                    JobState.CANCELLED,
                    f"{reason} (before it started)",
                    now=now,
                    cancel_requested_at=now,
                    cancel_reason=reason,
                )
            elif job.cancel_requested_at is None:
                conn.execute(
                    db.jobs.update()
                    .where(db.jobs.c.id == job_id)
                    .values(cancel_requested_at=now, cancel_reason=reason, updated_at=now)
                )
                append_event(
                    conn,
                    job.id,
                    job.attempt,
                    {
                        "type": "log",
                        "time": now,
                        "level": "info",
                        "source": "control",
                        "message": f"cancel requested: {reason}; the trainer stops at the next step boundary",
                    },
                )
            job = JobRow.from_row(conn.execute(sa.select(db.jobs).where(db.jobs.c.id == job_id)).one())
        return self._with_transitions(job)

    def start_attempt(self, job: JobRow, submission_id: str, run_dir: str) -> JobRow:
        """queued -> starting, recording where the attempt runs (its token is minted at submission)."""
        with self.write() as conn:
            now = time.time()
            job = apply_transition(
                conn,
                job,
                JobState.STARTING,
                f"submitted to Ray as {submission_id}",
                now=now,
                ray_submission_id=submission_id,
                run_dir=run_dir,
                job_token_hash=None,
                ray_done=False,
                started_at=now,
                reported_at=None,
            )
        return self._with_transitions(job)

    def resume(self, job_id: str, checkpoint: str, reason: str) -> JobRow:
        """A new attempt of a failed/cancelled job from `checkpoint`: back to queued."""
        with self.write() as conn:
            row = conn.execute(sa.select(db.jobs).where(db.jobs.c.id == job_id)).first()
            if row is None:
                raise JobNotFound(job_id)
            job = JobRow.from_row(row)
            if not job.ray_done:
                raise InvalidTransition(
                    f"job {job_id}: its previous Ray job is still shutting down; retry shortly"
                )
            self._check_queue(conn, job.tenant)
            job = apply_transition(
                conn,
                job,
                JobState.QUEUED,
                f"{reason} (attempt {job.attempt + 1} from {checkpoint})",
                attempt=job.attempt + 1,
                resume_from=checkpoint,
                cancel_requested_at=None,
                cancel_reason=None,
                hard_stopped=False,
                finished_at=None,
                started_at=None,
                ray_submission_id=None,
                run_dir=None,
                job_token_hash=None,
                ray_done=True,
                reported_at=None,
            )
        return self._with_transitions(job)

    # -- retention --------------------------------------------------------------------------------
    def expire_ended(
        self, max_age_s: float, keep_per_tenant: int, now: float | None = None, batch: int = 500
    ) -> builtins.list[ExpiredJob]:
        """Delete ended jobs past retention, with every row that belongs to them; returns what was deleted.

        Expired: ended more than `max_age_s` ago (0: no age limit), or beyond the `keep_per_tenant` most
        recently ended jobs of its tenant (0: no count limit). Only jobs that are ended and whose Ray job is
        gone are deleted: the state is checked again under the write lock, so a job resumed meanwhile stays.
        At most `batch` jobs a call, so one sweep never holds the write lock for long.
        """
        if not max_age_s and not keep_per_tenant:
            return []
        now = time.time() if now is None else now
        ended = [s.value for s in TERMINAL]
        # Rank each tenant's ended jobs, the most recently ended first.
        rank = (
            sa.func.row_number()
            .over(
                partition_by=db.jobs.c.tenant,
                order_by=(db.jobs.c.finished_at.desc().nulls_last(), db.jobs.c.seq.desc()),
            )
            .label("rank")
        )
        ranked = (
            sa.select(db.jobs.c.id, db.jobs.c.finished_at, db.jobs.c.ray_done, rank)
            .where(db.jobs.c.state.in_(ended))
            .subquery()
        )
        expired = []
        if max_age_s:
            expired.append(ranked.c.finished_at < now - max_age_s)
        if keep_per_tenant:
            expired.append(ranked.c.rank > keep_per_tenant)
        candidates = sa.select(ranked.c.id).where(ranked.c.ray_done.is_(True), sa.or_(*expired)).limit(batch)
        with self.write() as conn:
            rows = conn.execute(
                sa.select(db.jobs.c.id, db.jobs.c.tenant)
                .where(db.jobs.c.id.in_(candidates), db.jobs.c.state.in_(ended), db.jobs.c.ray_done.is_(True))
                .with_for_update()
            ).all()
            ids = [r.id for r in rows]
            if ids:
                for table in (db.events, db.metrics, db.checkpoints, db.transitions, db.driver_logs):
                    conn.execute(table.delete().where(table.c.job_id.in_(ids)))
                conn.execute(db.jobs.delete().where(db.jobs.c.id.in_(ids)))
        return [ExpiredJob(r.id, r.tenant) for r in rows]

    # -- driver logs (tail of the Ray driver's stdout/stderr, kept after the Ray job is gone) ----------
    def save_driver_log(self, job_id: str, attempt: int, text: str) -> None:
        with self.write() as conn:
            conn.execute(
                db.driver_logs.delete().where(
                    db.driver_logs.c.job_id == job_id, db.driver_logs.c.attempt == attempt
                )
            )
            conn.execute(
                db.driver_logs.insert().values(job_id=job_id, attempt=attempt, text=text, time=time.time())
            )

    def driver_log(self, job_id: str, attempt: int) -> str | None:
        with self.read() as conn:
            return conn.execute(
                sa.select(db.driver_logs.c.text).where(
                    db.driver_logs.c.job_id == job_id, db.driver_logs.c.attempt == attempt
                )
            ).scalar_one_or_none()
