"""SQL tables (SQLAlchemy Core) and engine setup: SQLite in WAL mode by default, PostgreSQL by URL.

These definitions are the *current* schema used by queries; `migrations.py` builds it step by step
and a test checks that the two agree.
"""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.String(200), nullable=False),
    sa.Column("applied_at", sa.Float, nullable=False),
)

tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("max_concurrent_jobs", sa.Integer, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False, index=True),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("is_admin", sa.Boolean, nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revoked_at", sa.Float, nullable=True),
)

jobs = sa.Table(
    "jobs",
    metadata,
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
    sa.Column("reported_at", sa.Float, nullable=True),
    sa.Column("run_dir", sa.Text, nullable=True),
    sa.Column("resume_from", sa.Text, nullable=True),
    sa.Column("job_token_hash", sa.String(64), nullable=True),
    sa.Column("idempotency_key", sa.String(255), nullable=True),
    sa.Column("request_digest", sa.String(64), nullable=True),
    sa.Column("grants", sa.Text, nullable=False, server_default=""),
    sa.UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
)

transitions = sa.Table(
    "transitions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(40), nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("from_state", sa.String(16), nullable=True),
    sa.Column("to_state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
)

events = sa.Table(
    "events",
    metadata,
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

metrics = sa.Table(
    "metrics",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(40), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.UniqueConstraint("job_id", "attempt", "step", name="uq_metrics_job_attempt_step"),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(40), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.UniqueConstraint("job_id", "attempt", "step", name="uq_checkpoints_job_attempt_step"),
)

driver_logs = sa.Table(
    "driver_logs",
    metadata,
    sa.Column("job_id", sa.String(40), primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
)

datasets = sa.Table(
    "datasets",
    metadata,
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


def _enable_wal(cur, deadline_s: float = 30.0) -> None:
    """Switch to WAL, retrying: on a fresh file the switch needs an exclusive lock and SQLite answers
    "database is locked" at once (no busy handler) while another connection is doing the same."""
    stop = time.monotonic() + deadline_s
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > stop:
                raise
            time.sleep(0.01 + random.random() * 0.04)


def make_engine(url: str) -> Engine:
    """An engine for `url`; for SQLite: WAL, a busy timeout, and `BEGIN IMMEDIATE` on request.

    Why IMMEDIATE: a deferred SQLite transaction that reads and then writes can fail with
    "database is locked" when another writer committed in between; write transactions therefore
    take the write lock up front (`engine.connect().execution_options(sqlite_begin="IMMEDIATE")`).
    """
    if url.startswith("sqlite"):
        db_path = sa.engine.make_url(url).database
        if db_path and db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20, max_overflow=20
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record) -> None:
            dbapi_conn.isolation_level = None  # pysqlite must not emit BEGIN itself; we do, below
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            _enable_wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn) -> None:
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
