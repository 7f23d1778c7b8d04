"""The SandboxFusion-compatible endpoint, served by uvicorn on loopback and called over real HTTP."""

import base64
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

from tgc_rl.sandbox import Sandbox, SandboxLimits
from tgc_rl.sandbox.http import create_app


@pytest.fixture(scope="module")
def client():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(Sandbox(SandboxLimits(wall_s=10.0)), max_concurrency=2)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        yield c
    server.should_exit = True
    thread.join(10)
    sock.close()


def run_code(client, **body):
    return client.post("/run_code", json={"language": "python", **body})


def test_a_finished_program_is_success_with_its_output(client):
    r = run_code(client, code="print(input().upper())", stdin="shout\n")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "Success" and body["compile_result"] is None
    run = body["run_result"]
    assert (run["status"], run["return_code"], run["stdout"], run["stderr"]) == ("Finished", 0, "SHOUT\n", "")
    assert run["execution_time"] > 0


def test_a_failing_program_is_failed_with_its_return_code(client):
    body = run_code(client, code="import sys\nsys.stderr.write('bad')\nsys.exit(2)").json()
    assert body["status"] == "Failed"
    assert (body["run_result"]["status"], body["run_result"]["return_code"]) == ("Finished", 2)
    assert body["run_result"]["stderr"] == "bad"


def test_a_program_past_run_timeout_is_time_limit_exceeded(client):
    body = run_code(client, code="import time\ntime.sleep(30)", run_timeout=0.5).json()
    assert body["status"] == "Failed" and body["run_result"]["status"] == "TimeLimitExceeded"


def test_memory_limit_is_applied(client):
    body = run_code(client, code="x = bytearray(300 << 20)\nprint('allocated')", memory_limit_MB=128).json()
    assert body["status"] == "Failed" and "MemoryError" in body["run_result"]["stderr"]


def test_files_go_in_and_fetch_files_come_back_base64(client):
    body = run_code(
        client,
        code="open('b.txt', 'w').write(open('a.txt').read()[::-1])",
        files={"a.txt": base64.b64encode(b"abc").decode()},
        fetch_files=["b.txt"],
    ).json()
    assert body["status"] == "Success"
    assert base64.b64decode(body["files"]["b.txt"]) == b"cba"


def test_bash_runs(client):
    body = client.post("/run_code", json={"language": "bash", "code": "echo $((6 * 7))"}).json()
    assert body["run_result"]["stdout"] == "42\n"


@pytest.mark.parametrize(
    "body,field",
    [
        ({"code": "x", "language": "cobol"}, "language"),
        ({"code": "x", "files": {"a": "%%%not base64"}}, "files"),
        ({"code": "x", "files": {"../a": "eA=="}}, "files"),
        ({"code": "x", "fetch_files": ["/etc/shadow"]}, "fetch_files"),
        ({"code": "x", "run_timeout": -1}, "run_timeout"),
        ({"code": "x", "args": ["-k", "test"]}, "args"),
        ({"code": "x", "unexpected": 1}, "unexpected"),
    ],
)
def test_bad_requests_are_422_naming_the_field(client, body, field):
    r = client.post("/run_code", json=body)
    assert r.status_code == 422
    assert field in r.text


@pytest.mark.parametrize(
    "body,field",
    [
        ('{"code": "x", "run_timeout": NaN}', "run_timeout"),
        ('{"code": "x", "run_timeout": Infinity}', "run_timeout"),
        ('{"code": "x", "compile_timeout": 1e308}', "compile_timeout"),
        ('{"code": "x", "memory_limit_MB": 100000000000000000000}', "memory_limit_MB"),
        ('{"code": "x", "files": {' + ", ".join(f'"f{i}": "eA=="' for i in range(20_000)) + "}}", "files"),
        (
            '{"code": "x", "fetch_files": [' + ", ".join(f'"f{i}"' for i in range(20_000)) + "]}",
            "fetch_files",
        ),
    ],
)
def test_out_of_range_requests_are_422_not_500(client, body, field):
    r = client.post("/run_code", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and field in r.text, r.text[:300]


def test_the_largest_accepted_file_set_runs(client):
    files = {f"d/f{i}.txt": base64.b64encode(b"x").decode() for i in range(256)}
    r = run_code(client, code="import os; print(len(os.listdir('d')))", files=files)
    assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "256\n", r.text[:300]


def test_ping_answers_pong(client):
    assert client.get("/v1/ping").json() == "pong"


def test_metrics_expose_sandbox_runs(client):
    run_code(client, code="pass")
    text = client.get("/metrics/").text
    assert 'tgc_sandbox_runs_total{status="finished"}' in text
    assert "tgc_sandbox_run_seconds_bucket" in text


def test_concurrent_requests_are_all_served(client):
    with ThreadPoolExecutor(6) as ex:
        bodies = list(ex.map(lambda i: run_code(client, code=f"print({i} * {i})").json(), range(12)))
    assert [b["run_result"]["stdout"] for b in bodies] == [f"{i * i}\n" for i in range(12)]


def test_the_default_concurrency_is_the_cpus_this_process_may_run_on_not_the_hosts():
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # as a taskset or a container's cpuset would
        assert create_app(Sandbox()).state.max_concurrency == 1
    finally:
        os.sched_setaffinity(0, before)
    assert create_app(Sandbox(), max_concurrency=3).state.max_concurrency == 3
