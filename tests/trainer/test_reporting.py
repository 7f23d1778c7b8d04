"""The trainer's reporter: events land in events.jsonl and reach the control plane over real HTTP,
whose answer can ask the job to stop; a dead control plane never loses events."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tgc_rl.run_layout import JobState
from tgc_rl.trainer.reporting import Reporter


class _ControlPlane(BaseHTTPRequestHandler):
    received: list = []
    cancel = False

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append((self.path, self.headers["Authorization"], body))
        reply = json.dumps({"cancel": type(self).cancel, "reason": "user asked"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture
def control_plane():
    _ControlPlane.received, _ControlPlane.cancel = [], False
    server = HTTPServer(("127.0.0.1", 0), _ControlPlane)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_events_are_written_locally(tmp_path):
    r = Reporter(tmp_path)
    r.state(JobState.RUNNING, "started", 0)
    r.step(1, {"reward/mean": 0.5})
    lines = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in lines] == ["state", "step"] and lines[1]["metrics"]["reward/mean"] == 0.5


def test_events_reach_the_control_plane_with_the_job_token(tmp_path, control_plane):
    url = f"http://127.0.0.1:{control_plane.server_port}"
    r = Reporter(tmp_path, url, "job-7", "secret")
    r.step(1, {})
    path, auth, body = _ControlPlane.received[0]
    assert path == "/v1/internal/jobs/job-7/events" and auth == "Bearer secret"
    assert body["events"][0]["step"] == 1 and r.cancel_requested is None


def test_control_plane_reply_requests_cancel(tmp_path, control_plane):
    _ControlPlane.cancel = True
    r = Reporter(tmp_path, f"http://127.0.0.1:{control_plane.server_port}", "j", "t")
    r.step(2, {})
    assert r.cancel_requested == "user asked"


def test_unreachable_control_plane_buffers_then_delivers(tmp_path, control_plane):
    port = control_plane.server_port
    r = Reporter(tmp_path, "http://127.0.0.1:9", "j", "t", timeout_s=0.5)  # nothing listens on port 9
    r.step(1, {})
    r.step(2, {})
    assert len(r._pending) == 2
    r.url = f"http://127.0.0.1:{port}/v1/internal/jobs/j/events"
    r.flush()
    assert [e["step"] for e in _ControlPlane.received[0][2]["events"]] == [1, 2] and not r._pending


def test_non_finite_metrics_are_reported_as_null(tmp_path, control_plane):
    r = Reporter(tmp_path, f"http://127.0.0.1:{control_plane.server_port}", "j", "t")
    r.step(1, {"loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-5})
    sent = _ControlPlane.received[0][2]["events"][0]["metrics"]
    assert sent == {"loss": None, "grad_norm": None, "lr": 1e-5} and not r._pending
    local = json.loads((tmp_path / "events.jsonl").read_text())
    assert local["metrics"]["loss"] is None


def test_a_residual_on_a_cancelling_objective_is_logged_first_and_then_every_50th_step(tmp_path):
    from tgc_rl.trainer.loop import ResidualWatch

    watch = ResidualWatch(True, "cp_grpo", Reporter(tmp_path))
    assert watch.check(1, {"diag/d2_residual": 5e-9}) is None  # float rounding: cancellation holds
    assert watch.check(2, {}) is None  # a step without shared nodes measures nothing
    broken = {"diag/d2_residual": 0.01, "diag/d4_groups_complete_frac": 0.5}
    said = [m for step in range(3, 106) if (m := watch.check(step, broken))]
    assert len(said) == 3 and watch.count == 103  # steps 3, 53 and 103
    assert said[0].startswith("step 3: D2 residual 0.01 > 0.0001 although objective 'cp_grpo' preserves")
    assert "(1 such step(s) so far)" in said[0] and "(complete groups: 50%)" in said[0]
    logged = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["message"] for e in logged if e["type"] == "log"] == said  # what `tgc logs` shows
    grpo = ResidualWatch(False, "grpo", Reporter(tmp_path / "grpo"))
    assert grpo.check(1, {"diag/d2_residual": 0.02}) is None and grpo.count == 0  # it never claimed it
