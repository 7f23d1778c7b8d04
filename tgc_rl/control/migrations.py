"""Versioned schema migrations: an ordered list of steps, each applied once, recorded in `schema_version`.

Each step is frozen once released: it builds its own table objects instead of using `db.py` (which
is the current shape), so an old database upgrades through exactly the steps a new one goes through.
A new schema change = a new `Migration` at the end of `MIGRATIONS`, and the matching edit in `db.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def _v1_initial(conn: Connection) -> None:
    m = sa.MetaData()
    sa.Table(
        "tenants",
        m,
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("max_concurrent_jobs", sa.Integer, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    sa.Table(
        "tokens",
        m,
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("is_admin", sa.Boolean, nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=True),
    )
    sa.Table(
        "jobs",
        m,
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(40), nullable=False, unique=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=True),
        sa.Column("latest_metrics", sa.Text, nullable=True),
        sa.Column("cancel_requested_at", sa.Float, nullable=True),
        sa.Column("cancel_reason", sa.Text, nullable=True),
        sa.Column("hard_stopped", sa.Boolean, nullable=False),
        sa.Column("ray_submission_id", sa.String(80), nullable=True),
        sa.Column("ray_done", sa.Boolean, nullable=False),
        sa.Column("run_dir", sa.Text, nullable=True),
        sa.Column("resume_from", sa.Text, nullable=True),
        sa.Column("job_token_hash", sa.String(64), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("request_digest", sa.String(64), nullable=True),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
    )
    sa.Table(
        "transitions",
        m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), nullable=False, index=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
    )
    sa.Table(
        "events",
        m,
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.UniqueConstraint("job_id", "attempt", "digest", name="uq_events_job_attempt_digest"),
        sa.Index("ix_events_job_seq", "job_id", "seq"),
    )
    sa.Table(
        "metrics",
        m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.UniqueConstraint("job_id", "attempt", "step", name="uq_metrics_job_attempt_step"),
    )
    sa.Table(
        "checkpoints",
        m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.UniqueConstraint("job_id", "attempt", "step", name="uq_checkpoints_job_attempt_step"),
    )
    m.create_all(conn)


def _v2_driver_logs_and_report_time(conn: Connection) -> None:
    m = sa.MetaData()
    sa.Table(
        "driver_logs",
        m,
        sa.Column("job_id", sa.String(40), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
    )
    m.create_all(conn)
    conn.exec_driver_sql("ALTER TABLE jobs ADD COLUMN reported_at FLOAT")


def _v3_job_grants(conn: Connection) -> None:
    conn.exec_driver_sql("ALTER TABLE jobs ADD COLUMN grants TEXT NOT NULL DEFAULT ''")


def _v4_datasets(conn: Connection) -> None:
    m = sa.MetaData()
    sa.Table(
        "datasets",
        m,
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("rows", sa.Integer, nullable=False),
        sa.Column("columns", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("tenant", "sha256", name="uq_datasets_tenant_sha256"),
    )
    m.create_all(conn)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1, "initial schema: tenants, tokens, jobs, transitions, events, metrics, checkpoints", _v1_initial
    ),
    Migration(2, "driver log tails; jobs.reported_at (last trainer report)", _v2_driver_logs_and_report_time),
    Migration(3, "jobs.grants: the privileges the operator granted a job at submission", _v3_job_grants),
    Migration(4, "datasets: files uploaded by tenants for the dataset task", _v4_datasets),
)


def _version_table(m: sa.MetaData) -> sa.Table:
    return sa.Table(
        "schema_version",
        m,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.String(200), nullable=False),
        sa.Column("applied_at", sa.Float, nullable=False),
    )


_PG_LOCK_KEY = 0x7467635F6D6967  # "tgc_mig": an application-chosen advisory lock id


def _lock(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")


def current_version(engine: Engine) -> int:
    if not sa.inspect(engine).has_table("schema_version"):
        return 0
    table = _version_table(sa.MetaData())
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.coalesce(sa.func.max(table.c.version), 0))).scalar_one()


def migrate(engine: Engine, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
    """Apply the pending migrations in order, each in its own transaction; returns the versions applied.

    Safe to run from several processes at once: a lock (SQLite: the write lock of IMMEDIATE; PostgreSQL:
    a transaction-scoped advisory lock) makes the others wait and then find nothing left to do.
    """
    versions = [mig.version for mig in migrations]
    if versions != sorted(set(versions)):
        raise ValueError(f"migration versions must be unique and increasing, got {versions}")
    table = _version_table(sa.MetaData())
    with engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
        _lock(conn)
        table.create(conn, checkfirst=True)
    applied: list[int] = []
    for mig in migrations:
        with engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
            _lock(conn)
            done = conn.execute(sa.select(table.c.version).where(table.c.version == mig.version)).first()
            if done:
                continue
            mig.apply(conn)
            conn.execute(
                table.insert().values(
                    version=mig.version, description=mig.description, applied_at=time.time()
                )
            )
            applied.append(mig.version)
    return applied
