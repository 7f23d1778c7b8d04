"""Retries with backoff: against a control plane that comes up late, and a loopback server that answers
503/429 a few times (the only way to get those statuses on demand)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tgc_rl.control.local import LocalControlPlane, free_port
from tgc_rl.sdk import Client, ServerError, Unavailable

RECORD = {
    "id": "job-1",
    "name": "x",
    "tenant": "acme",
    "state": "queued",
    "spec": {"steps": 1},
    "total_steps": 1,
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:00Z",
}


class Flaky:
    """Answers `failures` times with `status`, then 200/201 with a job record; records what it saw."""

    def __init__(self, failures: int, status: int = 503, retry_after: str | None = None):
        self.failures, self.status, self.retry_after = failures, status, retry_after
        self.seen: list[tuple[str, str, str | None]] = []
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                flaky.seen.append((self.command, self.path, self.headers.get("Idempotency-Key")))
                if len(flaky.seen) <= flaky.failures:
                    body, code = b'{"error": "unavailable", "message": "busy"}', flaky.status
                else:
                    page = {"jobs": [RECORD], "next_cursor": None}
                    body = json.dumps(
                        RECORD if self.path.startswith("/v1/jobs/") or self.command == "POST" else page
                    )
                    body, code = body.encode(), 201 if self.command == "POST" else 200
                self.send_response(code)
                if flaky.retry_after and code == flaky.status:
                    self.send_header("Retry-After", flaky.retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def flaky(request):
    servers = []

    def make(*args, **kwargs) -> Flaky:
        servers.append(Flaky(*args, **kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_reads_are_retried_through_transient_503s(flaky):
    srv = flaky(failures=2)
    with Client(srv.url, "tgc_x", backoff=0.01) as c:
        assert c.jobs()[0].id == "job-1"
    assert len(srv.seen) == 3


def test_submit_is_retried_with_one_idempotency_key(flaky):
    srv = flaky(failures=2)
    with Client(srv.url, "tgc_x", backoff=0.01) as c:
        assert c.submit({"steps": 1}).id == "job-1"
    keys = {key for _, _, key in srv.seen}
    assert len(srv.seen) == 3 and len(keys) == 1 and None not in keys


def test_a_non_idempotent_request_is_not_retried_on_503(flaky):
    srv = flaky(failures=5)
    with Client(srv.url, "tgc_x", backoff=0.01) as c, pytest.raises(ServerError):
        c.request("POST", "/v1/jobs/job-1/resume", json={})
    assert len(srv.seen) == 1


def test_retry_after_is_honoured_on_429(flaky):
    srv = flaky(failures=1, status=429, retry_after="1")
    start = time.monotonic()
    with Client(srv.url, "tgc_x", backoff=0.01) as c:
        c.jobs()
    assert time.monotonic() - start >= 0.9 and len(srv.seen) == 2


def test_gives_up_with_unavailable_after_the_retries():
    with (
        Client(f"http://127.0.0.1:{free_port()}", "tgc_x", retries=2, backoff=0.01) as c,
        pytest.raises(Unavailable, match="after 3 tries"),
    ):
        c.jobs()


def test_a_server_that_comes_up_late_is_reached_by_retrying(tmp_path):
    cp = LocalControlPlane(tmp_path, ray_address="none")
    token = cp.create_token("acme")
    timer = threading.Timer(1.0, cp.start)
    timer.start()
    try:
        with Client(cp.url, token, retries=8, backoff=0.5, max_backoff=4) as c:
            assert c.jobs() == []
    finally:
        timer.join()
        cp.stop()
