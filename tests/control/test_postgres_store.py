"""The job store on a real PostgreSQL server (a throwaway cluster started for this module).

Needs the PostgreSQL server binaries (Debian: `apt-get install postgresql`) and psycopg 3
(`pip install "psycopg[binary]"`); the module is skipped, saying so, where either is missing.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from tgc_rl.control import progress
from tgc_rl.control.db import make_engine
from tgc_rl.control.local import LocalControlPlane, free_port
from tgc_rl.control.migrations import MIGRATIONS, migrate
from tgc_rl.control.states import JobState
from tgc_rl.control.store import JobStore, QueueFull

BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
pytestmark = [
    pytest.mark.skipif(
        not BIN, reason="PostgreSQL server binaries not installed (apt-get install postgresql)"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("psycopg") is None,
        reason="psycopg 3 not installed (pip install 'psycopg[binary]')",
    ),
]


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: use its own system user when we are root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def pg_url() -> str:
    bin_dir = BIN[-1]
    # Not under pytest's tmp dir: that one is private to our user, and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="tgc-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    subprocess.run(
        _as_postgres([f"{bin_dir}/initdb", "-D", str(data), "-A", "trust", "-U", "tgc"]),
        check=True,
        capture_output=True,
    )
    port = free_port()
    try:
        # Inside the try: a start that times out may still leave a server running.
        subprocess.run(
            _as_postgres(
                [
                    f"{bin_dir}/pg_ctl",
                    "-D",
                    str(data),
                    "-w",
                    "-l",
                    str(root / "log"),
                    "-o",
                    f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c max_connections=200",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )
        yield f"postgresql+psycopg://tgc@127.0.0.1:{port}/postgres"
    finally:
        _stop(bin_dir, data)
        shutil.rmtree(root, ignore_errors=True)


def _stop(bin_dir: str, data: Path) -> None:
    """Stop the server and wait for it; `immediate` where a fast shutdown does not finish."""
    for mode in ("fast", "immediate"):
        stop = [f"{bin_dir}/pg_ctl", "-D", str(data), "-m", mode, "-w", "-t", "30", "stop"]
        subprocess.run(_as_postgres(stop), capture_output=True)
        if not (data / "postmaster.pid").exists():  # removed by the server as it exits
            return


@pytest.fixture
def fresh_db(pg_url) -> str:
    """A new empty database per test."""
    name = f"t{time.time_ns()}"
    engine = make_engine(pg_url).execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()
    return pg_url.rsplit("/", 1)[0] + f"/{name}"


def test_migrations_run_once_even_when_started_concurrently(fresh_db):
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(make_engine(fresh_db)))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(v for r in results for v in r) == [m.version for m in MIGRATIONS]


def test_racing_submissions_with_one_idempotency_key_create_one_job(fresh_db):
    engine = make_engine(fresh_db)
    migrate(engine)
    store = JobStore(engine)
    ids: list[str] = []
    threads = [
        threading.Thread(target=lambda: ids.append(store.create("acme", {"name": "a"}, "k")[0].id))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and len(store.list("acme")) == 1


def test_repeated_trainer_events_are_stored_once(fresh_db):
    engine = make_engine(fresh_db)
    migrate(engine)
    store = JobStore(engine)
    job = store.start_attempt(store.create("acme", {"name": "a"})[0], "tgc-x-1", "/tmp/r")
    batch = [
        progress.normalize_event({"type": "step", "time": 1.0, "step": 1, "metrics": {"loss": 0.5}}),
        progress.normalize_event({"type": "state", "time": 1.1, "state": "running", "reason": "go"}),
    ]
    assert len(progress.ingest(store, job.id, 1, batch).stored) == 2
    assert progress.ingest(store, job.id, 1, batch).stored == []
    assert store.get(job.id).state == JobState.RUNNING and len(progress.metric_rows(store, job.id)) == 1


def test_control_plane_serves_jobs_from_postgresql(fresh_db, tmp_path):
    cp = LocalControlPlane(tmp_path, ray_address="none", env={"TGC_DB_URL": fresh_db})
    token = cp.create_token("acme", db_url=fresh_db)
    with cp, httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {token}"}) as http:
        job = http.post("/v1/jobs", json={"name": "pg"}, headers={"Idempotency-Key": "x"}).json()
        assert (
            http.post("/v1/jobs", json={"name": "pg"}, headers={"Idempotency-Key": "x"}).json()["id"]
            == job["id"]
        )
        assert http.post(f"/v1/jobs/{job['id']}/cancel").json()["state"] == "cancelled"
        assert [j["id"] for j in http.get("/v1/jobs").json()["jobs"]] == [job["id"]]
    assert not (tmp_path / "tgc.db").exists()  # nothing went to SQLite


def test_retention_and_the_queued_quota_work_on_postgresql(fresh_db):
    engine = make_engine(fresh_db)
    migrate(engine)
    store = JobStore(engine, max_queued=3)
    ended = [store.request_cancel(store.create("acme", {"name": "a"})[0].id, "done").id for _ in range(3)]
    queued = [store.create("acme", {"name": "a"})[0].id for _ in range(3)]
    with pytest.raises(QueueFull):
        store.create("acme", {"name": "a"})
    gone = store.expire_ended(max_age_s=0, keep_per_tenant=1)  # window function, FOR UPDATE
    assert sorted(g.id for g in gone) == sorted(ended[:2])
    assert {j.id for j in store.list("acme")} == {ended[2], *queued}
    old = store.expire_ended(max_age_s=1, keep_per_tenant=0, now=time.time() + 10)
    assert [g.id for g in old] == [ended[2]]


def test_concurrent_submissions_never_overshoot_the_queued_quota_on_postgresql(fresh_db):
    engine = make_engine(fresh_db)
    migrate(engine)
    store = JobStore(engine, max_queued=3)
    results: list[str] = []

    def submit() -> None:
        try:
            store.create("acme", {"name": "a"})
            results.append("created")
        except QueueFull:
            results.append("full")

    threads = [threading.Thread(target=submit) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["created"] * 3 + ["full"] * 9
