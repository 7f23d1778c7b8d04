"""The `tgc` command against a real control plane (uvicorn child process; no Ray unless marked slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from tests.servers import control_plane_with_ray
from tests.specs import tiny_model
from tgc_rl.cli import main
from tgc_rl.control.db import make_engine
from tgc_rl.control.local import free_port
from tgc_rl.control.tokens import TokenStore

TINY = {
    "name": "cli-tiny",
    "model": tiny_model(),
    "resources": {"rollout_engine": "hf"},
    "task": {"reward_workers": 1},
    "group_size": 2,
    "prompts_per_step": 2,
    "sampling": {"max_new_tokens": 8},
    "steps": 2,
    "checkpoint": {"every_steps": 1},
}


@pytest.fixture
def api(api_server, monkeypatch):
    monkeypatch.setenv("TGC_URL", api_server.url)
    monkeypatch.setenv("TGC_TOKEN", api_server.acme)
    return api_server.cp


@pytest.fixture
def spec_file(tmp_path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_schema_prints_the_job_spec_json_schema(capsys):
    code, out, _ = run(capsys, "schema")
    schema = json.loads(out)
    assert code == 0 and schema["title"] == "JobSpec" and "steps" in schema["properties"]


def test_schema_prints_a_tasks_declared_params_with_their_privileges(capsys):
    code, out, _ = run(capsys, "schema", "--task", "code")
    props = json.loads(out)["properties"]
    assert (
        code == 0 and props["cases"]["maximum"] == 100 and props["sandbox"]["privilege"] == "unsafe_sandbox"
    )
    code, _, err = run(capsys, "schema", "--task", "mymod:factory")
    assert code != 0 and "free-form" in err


def test_tgc_console_script_is_installed():
    tgc = Path(sys.executable).with_name("tgc")
    out = subprocess.run([str(tgc), "--help"], capture_output=True, text=True, check=True).stdout
    assert "submit" in out and "serve" in out


def test_token_create_prints_the_secret_once_and_stores_only_its_hash(capsys, tmp_path):
    code, out, err = run(
        capsys, "token", "create", "--tenant", "acme", "--data-dir", str(tmp_path), "--max-concurrent", "3"
    )
    secret = out.strip()
    assert code == 0 and secret.startswith("tgc_") and secret not in err
    engine = make_engine(f"sqlite:///{tmp_path / 'tgc.db'}")
    store = TokenStore(engine)
    assert store.authenticate(secret).tenant == "acme" and store.quota("acme") == 3
    with engine.connect() as conn:
        assert secret not in str(conn.execute(sa.text("SELECT * FROM tokens")).all())


def test_token_create_refuses_a_bad_tenant_name(capsys, tmp_path):
    code, _, err = run(capsys, "token", "create", "--tenant", "Not OK", "--data-dir", str(tmp_path))
    assert code == 2 and "tenant" in err


def test_token_list_and_revoke(capsys, tmp_path):
    run(capsys, "token", "create", "--tenant", "acme", "--data-dir", str(tmp_path))
    _, listing, _ = run(capsys, "token", "list", "--data-dir", str(tmp_path))
    token_id = listing.split()[0]
    assert "acme" in listing and "active" in listing
    assert run(capsys, "token", "revoke", token_id, "--data-dir", str(tmp_path))[0] == 0
    assert "revoked" in run(capsys, "token", "list", "--data-dir", str(tmp_path))[1]


def test_submit_dry_run_validates_on_the_server(capsys, api, spec_file):
    code, out, _ = run(capsys, "submit", str(spec_file), "--dry-run")
    assert code == 0 and "valid" in out


def test_submit_of_an_invalid_spec_exits_2_naming_the_field(capsys, api, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**TINY, "steps": -1, "colour": "red"}))
    code, _, err = run(capsys, "submit", str(bad))
    assert code == 2 and "steps" in err and "colour: unknown field" in err


def test_submit_then_jobs_status_cancel(capsys, api, spec_file):
    code, out, _ = run(capsys, "submit", str(spec_file), "-q")
    job_id = out.strip().splitlines()[-1]
    assert code == 0 and job_id.startswith("job-")
    assert job_id in run(capsys, "jobs")[1]
    code, out, _ = run(capsys, "status", job_id)
    assert code == 0 and "queued" in out and "accepted" in out
    code, out, _ = run(capsys, "cancel", job_id, "--reason", "cli test")
    assert code == 0 and "cancelled" in out
    record = json.loads(run(capsys, "status", job_id, "--json")[1])
    assert record["state"] == "cancelled" and "cli test" in record["reason"]
    assert run(capsys, "cancel", job_id)[0] == 1  # already ended: the API's 409


def test_jobs_json_filters_by_state(capsys, api, spec_file):
    job_id = run(capsys, "submit", str(spec_file), "-q")[1].strip()
    run(capsys, "cancel", job_id)
    listed = json.loads(run(capsys, "jobs", "--state", "cancelled", "--json")[1])
    assert job_id in {j["id"] for j in listed} and all(j["state"] == "cancelled" for j in listed)


def test_status_of_an_unknown_job_exits_1(capsys, api):
    code, _, err = run(capsys, "status", "job-doesnotexist")
    assert code == 1 and "no job" in err


def test_unreachable_server_exits_3(capsys, monkeypatch, spec_file):
    monkeypatch.setenv("TGC_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("TGC_TOKEN", "tgc_x")
    from tgc_rl.sdk import client as sdk_client

    monkeypatch.setattr(
        sdk_client.Client, "_sleep_before_retry", lambda *a, **k: None
    )  # no waiting between tries
    assert run(capsys, "jobs")[0] == 3


def test_logs_of_a_job_without_lines_prints_nothing(capsys, api, spec_file):
    job_id = run(capsys, "submit", str(spec_file), "-q")[1].strip()
    run(capsys, "cancel", job_id)
    assert run(capsys, "logs", job_id, "-f") == (0, "", "")


class _LineReader:
    """A process's stdout lines, collected in a thread as they arrive."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self.thread.start()

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


@pytest.fixture(scope="module")
def ray_plane(tmp_path_factory):
    """One control plane with its managed Ray head for this module's job tests (a start-up of each costs
    ~10 s here); each test submits its own job under its own token."""
    with control_plane_with_ray(tmp_path_factory.mktemp("cli-cp")) as cp:
        yield cp


@pytest.mark.slow
def test_logs_follow_prints_a_running_jobs_lines_until_it_ends(ray_plane):
    from tgc_rl.control.store import JobStore
    from tgc_rl.sdk import Client

    cp = ray_plane
    proc = None
    with Client(cp.url, token := cp.create_token("acme")) as client:
        store = JobStore(
            make_engine(f"sqlite:///{cp.data_dir / 'tgc.db'}")
        )  # the server's own DB, to add a log line
        env = {**os.environ, "TGC_URL": cp.url, "TGC_TOKEN": token}
        try:
            job = client.submit({**TINY, "name": "cli-logs", "steps": 500})
            next(e for e in job.stream() if e.type == "step")  # running: its first step is done
            store.log_event(store.get(job.id), "logged before tgc started")
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("tgc")), "logs", job.id, "-f"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            out = _LineReader(proc)
            assert out.wait_for("logged before tgc started", 60), out.lines  # its first read is done
            store.log_event(store.get(job.id), "logged while tgc follows")
            assert out.wait_for("logged while tgc follows", 30), out.lines
            assert proc.poll() is None and job.refresh().state.value == "running"
            job.cancel("enough logs")  # logs the request; the trainer then stops at a step boundary
            code = proc.wait(timeout=600)
            ended_at = time.time()
            out.thread.join(10)
            job.refresh()
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert code == 0, proc.stderr.read()[-3000:]
    assert job.state.value == "cancelled" and job.record.finished_at.timestamp() <= ended_at
    assert any("cancel requested: enough logs" in line for line in out.lines), out.lines


@pytest.mark.slow
def test_submit_follow_shows_progress_until_success(ray_plane, spec_file):
    cp = ray_plane
    tgc = Path(sys.executable).with_name("tgc")
    env = {**os.environ, "TGC_URL": cp.url, "TGC_TOKEN": cp.create_token("acme")}
    proc = subprocess.run(
        [str(tgc), "submit", str(spec_file), "--follow"], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "state running" in out and "step 2/2" in out and "succeeded" in out.splitlines()[-1]
