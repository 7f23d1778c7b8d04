"""Per-tenant and per-connection limits against a real server on loopback, with short limits set through
its settings: queued-job quota, per-token request rate, retention of ended jobs, event-stream cap,
lifetime and re-authentication, and slow clients (trickled headers and bodies, idle keep-alive)."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.servers import auth
from tgc_rl.control.db import make_engine
from tgc_rl.control.limits import RateLimiter, StreamSlots
from tgc_rl.control.local import LocalControlPlane
from tgc_rl.control.tokens import TokenStore
from tgc_rl.sdk import Client

TINY = {"name": "tiny", "steps": 3, "group_size": 2, "prompts_per_step": 2}
METRICS_TOKEN = "metrics-token-0123456789abcdef"
LIMITS = {
    "TGC_MAX_QUEUED_JOBS": "3",
    "TGC_RATE_LIMIT_PER_S": "2",
    "TGC_RATE_LIMIT_BURST": "20",
    "TGC_MAX_STREAMS_PER_TENANT": "2",
    "TGC_STREAM_MAX_S": "2",
    "TGC_STREAM_REAUTH_S": "0.25",
    "TGC_SSE_POLL_S": "0.1",
    "TGC_MAX_ENDED_JOBS_PER_TENANT": "2",
    "TGC_RETENTION_SWEEP_S": "0.3",
    "TGC_KEEP_ALIVE_S": "1",
    "TGC_CLIENT_HEADER_TIMEOUT_S": "1",
    "TGC_CLIENT_BODY_TIMEOUT_S": "1",
    "TGC_METRICS_TOKEN": METRICS_TOKEN,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LocalControlPlane]:
    cp = LocalControlPlane(tmp_path_factory.mktemp("limits"), ray_address="none", env=LIMITS)
    with cp:
        yield cp


def _token(server: LocalControlPlane, tenant: str) -> str:
    return server.create_token(tenant)


def _token_store(server: LocalControlPlane) -> TokenStore:
    return TokenStore(make_engine(f"sqlite:///{(server.data_dir / 'tgc.db').resolve()}"))


def _submit(http: httpx.Client, token: str, **headers: str) -> httpx.Response:
    return http.post("/v1/jobs", json=TINY, headers={**auth(token), **headers})


@pytest.fixture
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


# -- queued jobs ------------------------------------------------------------------------------------
def test_submissions_beyond_the_queued_quota_are_429_naming_the_limit(server, http):
    token, other = _token(server, "queuer"), _token(server, "bystander")
    ids = [_submit(http, token).json()["id"] for _ in range(3)]
    r = _submit(http, token, **{"Idempotency-Key": "fourth"})
    assert r.status_code == 429, r.text
    body = r.json()
    assert body["error"] == "too_many_requests" and "max_queued_jobs" in body["message"]
    assert "cancel" in body["message"] and int(r.headers["Retry-After"]) > 0
    assert _submit(http, other).status_code == 201  # another tenant's queue is its own
    assert http.post("/v1/jobs?dry_run=true", json=TINY, headers=auth(token)).status_code == 200
    # a replay of an earlier submission is not a new job: it answers even while the queue is full
    first = _submit(http, token, **{"Idempotency-Key": "k1"})
    assert first.status_code == 429  # (the queue is full, so k1 was never stored)
    http.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth(token)).raise_for_status()
    assert _submit(http, token, **{"Idempotency-Key": "k1"}).status_code == 201  # room again
    assert _submit(http, token, **{"Idempotency-Key": "k1"}).status_code == 200  # replay while full


# -- request rate -----------------------------------------------------------------------------------
def test_a_token_beyond_its_rate_gets_429_with_retry_after_and_others_do_not(server, http):
    token, same_tenant = _token(server, "chatty"), _token(server, "chatty")
    start = time.monotonic()
    codes = [http.get("/v1/jobs", headers=auth(token)) for _ in range(40)]
    elapsed = time.monotonic() - start
    ok = [r for r in codes if r.status_code == 200]
    limited = [r for r in codes if r.status_code == 429]
    assert len(ok) + len(limited) == 40
    assert 20 <= len(ok) <= 20 + 2 * elapsed + 1  # the burst, then 2 a second
    assert all(r.status_code == 200 for r in codes[:20])
    r = limited[0]
    assert r.json()["error"] == "too_many_requests" and "rate_limit_per_s" in r.json()["message"]
    assert int(r.headers["Retry-After"]) >= 1
    assert http.get("/v1/jobs", headers=auth(same_tenant)).status_code == 200  # per token, not per tenant
    time.sleep(0.6)  # one request's worth of refill (2 a second)
    assert http.get("/v1/jobs", headers=auth(token)).status_code == 200


def test_probes_metrics_and_bad_tokens_are_not_rate_limited(server, http):
    for _ in range(25):
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 200
        assert http.get("/metrics", headers=auth(METRICS_TOKEN)).status_code == 200
        assert http.get("/v1/jobs", headers=auth("tgc_not-a-token")).status_code == 401


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 100),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_a_bucket_never_allows_more_than_its_burst_plus_its_rate(rate, burst, gaps):
    now = [0.0]
    limiter = RateLimiter(rate, burst, clock=lambda: now[0])
    allowed = 0
    for gap in gaps:
        now[0] += gap
        wait = limiter.acquire("t")
        if wait:  # Retry-After is honest: after that long the request passes
            now[0] += wait
            assert limiter.acquire("t") == 0.0
        allowed += 1
        assert allowed <= burst + rate * now[0] + 1e-6


def test_the_bucket_table_forgets_refilled_buckets():
    now = [0.0]
    limiter = RateLimiter(10, 5, clock=lambda: now[0])
    for i in range(5000):
        limiter.acquire(f"token-{i}")
    assert len(limiter._buckets) == 5000  # all in use: kept (the next look is at twice as many)
    now[0] += 1.0  # every one of them has refilled
    for i in range(3500):
        limiter.acquire(f"new-{i}")
    assert len(limiter._buckets) < 4000  # the refilled 5000 are gone, the new ones kept
    assert limiter.acquire("new-0") == 0.0 and limiter._buckets["new-0"][0] < 5 - 1


def test_stream_slots_are_counted_per_tenant_and_given_back():
    slots = StreamSlots(2)
    assert slots.acquire("a") and slots.acquire("a") and not slots.acquire("a")
    assert slots.acquire("b")
    slots.release("a")
    assert slots.open("a") == 1 and slots.acquire("a")


# -- retention --------------------------------------------------------------------------------------
def test_retention_keeps_the_newest_ended_jobs_and_never_a_queued_one(server, http):
    token = _token(server, "archivist")
    runs = server.data_dir / "runs"
    ended = []
    for _ in range(4):
        job_id = _submit(http, token).json()["id"]
        (runs / job_id / "attempt-1").mkdir(parents=True)
        http.post(f"/v1/jobs/{job_id}/cancel", headers=auth(token)).raise_for_status()
        ended.append(job_id)
        time.sleep(0.05)  # distinct end times
    queued = _submit(http, token).json()["id"]
    (runs / queued / "attempt-1").mkdir(parents=True)
    outside = server.data_dir / "keep-me"
    outside.mkdir()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # records go first, then the run directories
        if http.get(f"/v1/jobs/{ended[1]}", headers=auth(token)).status_code == 404 and not any(
            (runs / job_id).exists() for job_id in ended[:2]
        ):
            break
        time.sleep(0.6)  # within the token's request rate
    listed = {j["id"] for j in http.get("/v1/jobs", headers=auth(token)).json()["jobs"]}
    assert listed == {queued, ended[2], ended[3]}  # the two most recently ended, and the queued one
    for job_id in ended[:2]:
        assert not (runs / job_id).exists()
        assert http.get(f"/v1/jobs/{job_id}/events?follow=false", headers=auth(token)).status_code == 404
    for job_id in (*ended[2:], queued):
        assert (runs / job_id / "attempt-1").is_dir()
    assert outside.is_dir()


# -- event streams ----------------------------------------------------------------------------------
def _open_stream(http: httpx.Client, job_id: str, token: str):
    # a read timeout below the server's keep-alive interval (15 s): a stream that never ends fails fast
    return http.stream(
        "GET", f"/v1/jobs/{job_id}/events", headers=auth(token), timeout=httpx.Timeout(10, read=5)
    )


def test_a_tenant_holds_at_most_its_cap_of_open_streams(server, http):
    token, other = _token(server, "watcher"), _token(server, "other-watcher")
    job_id = _submit(http, token).json()["id"]
    other_job = _submit(http, other).json()["id"]
    with _open_stream(http, job_id, token) as a, _open_stream(http, job_id, token) as b:
        assert a.status_code == b.status_code == 200
        with httpx.Client(base_url=server.url, timeout=30) as second:
            with _open_stream(second, job_id, token) as r:
                assert r.status_code == 429
                assert "max_streams_per_tenant" in r.read().decode() and int(r.headers["Retry-After"]) > 0
            with _open_stream(second, other_job, other) as c:  # another tenant's cap is its own
                assert c.status_code == 200
    # closed streams give their slots back (once the server notices the disconnect: on a loaded machine that
    # took over 5 s, so the bound is generous; the loop ends as soon as a slot is free)
    deadline = time.monotonic() + 30
    while True:
        with _open_stream(http, job_id, token) as again:
            if again.status_code == 200:
                break
        assert time.monotonic() < deadline, "a closed stream kept its slot"
        time.sleep(0.1)


def _lines_until_closed(response: httpx.Response, timeout_s: float = 10) -> tuple[list[str], float]:
    start = time.monotonic()
    lines = []
    for line in response.iter_lines():
        lines.append(line)
        assert time.monotonic() - start < timeout_s
    return lines, time.monotonic() - start


def test_a_stream_ends_at_its_lifetime_with_a_reconnect_hint(server, http):
    token = _token(server, "lifer")
    job_id = _submit(http, token).json()["id"]
    with _open_stream(http, job_id, token) as r:
        lines, took = _lines_until_closed(r)
    assert took >= 1.9, took  # not before its lifetime; the reconnect hint below says the lifetime ended it
    assert "event: state" in lines and "retry: 1000" in lines
    assert not any(line == "event: end" for line in lines)  # the job has not ended: no `end`


def test_a_stream_stops_soon_after_its_token_is_revoked(server, http):
    token = _token(server, "revoked")
    job_id = _submit(http, token).json()["id"]
    store = _token_store(server)
    token_id = next(t.id for t in store.list("revoked"))
    with _open_stream(http, job_id, token) as r:
        assert r.status_code == 200
        threading.Timer(0.3, store.revoke, (token_id,)).start()
        lines, took = _lines_until_closed(r)
    store.engine.dispose()
    assert took < 1.9, took  # revoked at 0.3 s, checked every 0.25 s; the lifetime (2 s) is not what ended it
    assert any("revoked" in line for line in lines) and "retry: 1000" not in lines
    assert http.get(f"/v1/jobs/{job_id}/events", headers=auth(token)).status_code == 401


def test_the_sdk_follows_a_job_across_stream_lifetimes(server, http):
    token = _token(server, "follower")
    job_id = _submit(http, token).json()["id"]
    threading.Timer(
        4.5,
        lambda: httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel", headers=auth(token)).raise_for_status(),
    ).start()
    with Client(server.url, token) as client:
        job = client.job(job_id)
        # reconnects=0: a stream the server ends at its lifetime is not a lost connection
        events = list(job.stream(reconnects=0))
    states = [e.data["state"] for e in events if e.type == "state"]
    assert states == ["queued", "cancelled"]  # two lifetimes passed: nothing lost, nothing repeated
    assert len({e.seq for e in events}) == len(events)
    assert job.state.value == "cancelled"


def test_tgc_submit_follow_follows_across_stream_lifetimes(server, tmp_path, capsys):
    import yaml

    from tgc_rl.cli import main

    token = _token(server, "cli-follower")

    def cancel_the_queued_job() -> None:
        with httpx.Client(base_url=server.url, headers=auth(token), timeout=30) as c:
            for job in c.get("/v1/jobs").json()["jobs"]:
                c.post(f"/v1/jobs/{job['id']}/cancel").raise_for_status()

    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    timer = threading.Timer(4.5, cancel_the_queued_job)  # two stream lifetimes (2 s each)
    timer.start()
    try:
        code = main(["submit", str(spec), "--follow", "--url", server.url, "--token", token])
    finally:
        timer.join()
    out = capsys.readouterr().out
    assert code == 0 and "cancelled" in out.splitlines()[-1], out


def test_a_trainers_event_type_cannot_add_fields_to_the_stream(server, http):
    from tgc_rl.control import tokens
    from tgc_rl.control.store import JobStore

    token = _token(server, "forged")
    job_id = _submit(http, token).json()["id"]
    engine = make_engine(f"sqlite:///{(server.data_dir / 'tgc.db').resolve()}")
    store = JobStore(engine)
    store.start_attempt(store.get(job_id), f"tgc-{job_id}-1", str(server.data_dir / "runs" / job_id))
    secret = tokens.mint(tokens.JOB_PREFIX)
    store.update(job_id, job_token_hash=tokens.digest(secret))
    engine.dispose()
    forged = {"type": "x\nevent: end\nid: 999999", "time": time.time()}
    r = http.post(f"/v1/internal/jobs/{job_id}/events", json={"events": [forged]}, headers=auth(secret))
    r.raise_for_status()
    text = http.get(f"/v1/jobs/{job_id}/events?follow=false", headers=auth(token)).text
    fields = [line.partition(":")[0] for line in text.splitlines() if line and not line.startswith(":")]
    assert fields.count("event") == 4  # queued, starting, the forged one (on one line), end
    assert [line for line in text.splitlines() if line.startswith("event: end")] == ["event: end"]
    assert "id: 999999" not in text.splitlines()


# -- slow clients -----------------------------------------------------------------------------------
def _connect(server: LocalControlPlane) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _closed_within(
    sock: socket.socket, payload: bytes, interval_s: float, limit_s: float
) -> tuple[float, bytes]:
    """Send `payload` a byte every `interval_s` until the server closes the connection; (seconds, what it said)."""
    start, said = time.monotonic(), b""
    payload_left = iter(payload)
    while time.monotonic() - start < limit_s:
        readable, _, _ = select.select([sock], [], [], interval_s)
        if readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:  # closed while a byte of ours was on its way
                chunk = b""
            if not chunk:
                return time.monotonic() - start, said
            said += chunk
            continue
        byte = next(payload_left, None)
        if byte is not None:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # reset by the server
                return time.monotonic() - start, said
    raise AssertionError(f"the connection was still open after {limit_s} s (server said {said[:200]!r})")


def test_headers_sent_a_byte_at_a_time_are_cut_off(server):
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 200 + b"\r\n\r\n"
    with _connect(server) as sock:
        took, said = _closed_within(sock, request, 0.1, limit_s=6)
    assert 0.8 <= took < 4, took
    assert said == b""  # never answered: the headers never completed


def test_a_connection_that_sends_nothing_is_closed(server):
    with _connect(server) as sock:
        took, _ = _closed_within(sock, b"", 0.1, limit_s=6)
    assert took < 4, took


@pytest.mark.parametrize(
    "path, content_type",
    [("/v1/jobs", "application/json"), ("/v1/datasets?name=rows.jsonl", "application/octet-stream")],
)
def test_a_body_sent_a_byte_at_a_time_is_answered_408_and_closed(server, path, content_type):
    token = _token(server, "trickler")
    body = b'{"name": "tiny", "steps": 3' + b" " * 200 + b"}"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with _connect(server) as sock:
        sock.sendall(head)
        took, said = _closed_within(sock, body, 0.1, limit_s=6)
    assert took < 4, took
    assert said.startswith(b"HTTP/1.1 408"), said[:200]
    assert b"client_body_timeout_s" in said
    datasets = server.data_dir / "datasets"
    assert not datasets.exists() or not [p for p in datasets.iterdir() if p.name.startswith(".staging")]


def test_an_idle_keep_alive_connection_is_closed_after_the_setting(server):
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        took, said = _closed_within(sock, b"", 0.05, limit_s=6)
    assert said.startswith(b"HTTP/1.1 200")
    assert 0.8 <= took < 4, took  # keep_alive_s = 1 (uvicorn's own default is 5)


def test_run_dirs_outside_job_ids_are_never_removed(tmp_path: Path):
    from tgc_rl.control.scheduler import RetentionSweeper
    from tgc_rl.control.settings import ControlSettings
    from tgc_rl.control.store import JobStore

    engine = make_engine(f"sqlite:///{tmp_path / 'tgc.db'}")
    sweeper = RetentionSweeper(JobStore(engine), ControlSettings(data_dir=tmp_path))
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "runs").mkdir()
    for hostile in ("..", ".", "../victim", "", "a/../../victim"):
        sweeper._remove_run_dir(hostile)
    assert victim.is_dir() and (tmp_path / "runs").is_dir()
    engine.dispose()
