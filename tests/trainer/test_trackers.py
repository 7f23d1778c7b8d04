"""Experiment trackers for real: an `mlflow server` started here on loopback (SQLite backend) and read back
through MLflow's client; wandb in offline mode, its run file read back record by record; and the queue in front
of each tracker, which drops and counts instead of slowing a job, and survives a tracker that fails."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tgc_rl.config import JobSpec, MlflowTrackerSpec, WandbTrackerSpec
from tgc_rl.control.local import free_port
from tgc_rl.trainer.traces import TraceRecord
from tgc_rl.trainer.trackers import QUEUE_SIZE, RunEnd, RunInfo, Trackers, flatten

STEPS = {
    1: {"reward/mean": 0.25, "diag/d2_residual": 1e-9},
    2: {"reward/mean": 0.5, "diag/d2_residual": 2e-9},
    3: {"reward/mean": 0.75, "diag/d2_residual": 3e-9, "eval/accuracy": 0.5},
}


def _records(step: int, n: int = 3) -> list[TraceRecord]:
    return [
        TraceRecord(
            step=step,
            group=0,
            index=i,
            prompt_index=i,
            prompt=f"what is {i}+{step}?",
            response=f"{i + step}",
            reward=float(i % 2),
            advantage=0.5 - i % 2,
            status="ok",
            length=2,
            finish_reason="stop",
            policy_version=step - 1,
            selected=["group"],
        )
        for i in range(n)
    ]


def _run(tmp_path: Path) -> RunInfo:
    spec = JobSpec.parse({"name": "tracked", "steps": 3, "trackers": ["mlflow", "wandb"]})
    return RunInfo(
        job="tracked",
        job_id="job-1",
        run_dir=tmp_path,
        params=flatten(spec.model_dump(mode="json", by_alias=True)),
    )


def _feed(trackers: Trackers, tmp_path: Path) -> Path:
    for step, metrics in STEPS.items():
        trackers.log_metrics(step, metrics)
        trackers.log_samples(step, _records(step))
    curves = tmp_path / "curves.png"
    curves.write_bytes(b"\x89PNG not really")
    trackers.close(RunEnd("succeeded", "/runs/tracked/checkpoints/step_3", [curves]))
    return curves


# -- MLflow ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on loopback with a SQLite store and a local artifact root; its URL."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{root}/mlflow.db",
        "--artifacts-destination",
        str(root / "artifacts"),
    ]
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = (
            time.monotonic() + 300
        )  # first start migrates the SQLite schema: ~70 s on a loaded 2-core CPU
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_mlflow_receives_the_spec_every_metric_the_samples_and_the_end(mlflow_server, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    run = _run(tmp_path)
    trackers = Trackers.from_spec([MlflowTrackerSpec(experiment="tgc-tests")], run)
    _feed(trackers, tmp_path)
    assert trackers.stats() == {
        "trackers/mlflow/dropped": 0.0,
        "trackers/mlflow/failed": 0.0,
        "trackers/mlflow/off": 0.0,
    }

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("tgc-tests")
    [found] = client.search_runs([exp.experiment_id])
    assert found.info.run_name == "tracked" and found.info.status == "FINISHED"
    assert found.data.params == dict(run.params)  # the resolved spec, every field
    assert found.data.params["objective.name"] == "cp_grpo" and found.data.params["trackers"].startswith("[")
    assert found.data.tags["tgc.final_checkpoint"] == "/runs/tracked/checkpoints/step_3"
    assert found.data.tags["tgc.job_id"] == "job-1"
    for key in ("reward/mean", "diag/d2_residual", "eval/accuracy"):
        history = client.get_metric_history(found.info.run_id, key)
        expected = {s: m[key] for s, m in STEPS.items() if key in m}
        assert {h.step: h.value for h in history} == expected, key
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {"curves.png", "samples"} <= artifacts
    local = client.download_artifacts(found.info.run_id, "samples/step-00000003.jsonl", str(tmp_path / "dl"))
    lines = Path(local).read_text().splitlines()
    assert [TraceRecord.model_validate_json(x) for x in lines] == _records(3)


def test_an_unreachable_mlflow_switches_off_and_the_job_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    trackers = Trackers.from_spec([MlflowTrackerSpec()], _run(tmp_path))
    for step, metrics in STEPS.items():
        trackers.log_metrics(step, metrics)  # queued: the stuck-tracker test below shows it never waits
    trackers.close(RunEnd("failed", None, []), timeout_s=60)
    stats = trackers.stats()
    assert (
        stats["trackers/mlflow/off"] == 1.0 and stats["trackers/mlflow/failed"] == 1.0
    )  # the start, then off


def test_mlflow_without_a_tracking_uri_is_left_out_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trackers = Trackers.from_spec([MlflowTrackerSpec()], _run(tmp_path))
    assert not trackers and "MLFLOW_TRACKING_URI is not set" in caplog.text
    trackers.close(RunEnd("succeeded", None, []))


# -- the queue ---------------------------------------------------------------------------------------------------
class _Stuck:
    """A tracker whose every call blocks until released: a server that stopped answering."""

    name = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.steps: list[int] = []

    def start(self, run: RunInfo) -> None:
        self.release.wait()

    def log_metrics(self, step, metrics) -> None:
        self.steps.append(step)

    def log_samples(self, step, records) -> None:
        pass

    def finish(self, end: RunEnd) -> None:
        pass


def _returns_while_stuck(call: Callable[[], None]) -> None:
    """`call` ends while the tracker is still blocked (nothing releases it before the caller is joined). A call
    that waited on the tracker would never end, so the generous join bounds only a broken case: no wall-clock
    figure that a busy machine could miss."""
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=60)
    assert not caller.is_alive(), f"{call} waited on the stuck tracker"


def test_a_stuck_tracker_drops_and_counts_instead_of_slowing_the_job(tmp_path):
    stuck = _Stuck()
    trackers = Trackers([stuck])
    trackers._each(lambda t: lambda: t.start(_run(tmp_path)))

    def log_past_the_queue() -> None:
        for step in range(1, QUEUE_SIZE + 51):
            trackers.log_metrics(step, {"reward/mean": 1.0})

    _returns_while_stuck(log_past_the_queue)
    assert (
        trackers.stats()["trackers/stuck/dropped"] >= 49
    )  # the queue holds QUEUE_SIZE (one call may be taken)
    # still stuck: the end gives up on it after its timeout instead of waiting
    _returns_while_stuck(lambda: trackers.close(RunEnd("succeeded", None, []), timeout_s=1.0))
    stuck.release.set()


class _Failing(_Stuck):
    name = "failing"

    def start(self, run: RunInfo) -> None:
        pass

    def log_metrics(self, step, metrics) -> None:
        self.steps.append(step)
        raise ConnectionError("server gone")


def test_a_failing_tracker_is_switched_off_after_repeated_failures(tmp_path):
    failing = _Failing()
    trackers = Trackers([failing])
    for step in range(1, 20):
        trackers.log_metrics(step, {"reward/mean": 1.0})
    trackers.close(RunEnd("succeeded", None, []))
    assert failing.steps == [1, 2, 3, 4, 5]  # MAX_FAILURES in a row, then no more calls
    assert trackers.stats() == {
        "trackers/failing/dropped": 0.0,
        "trackers/failing/failed": 5.0,
        "trackers/failing/off": 1.0,
    }


# -- wandb (offline) ---------------------------------------------------------------------------------------------
def _wandb_records(path: Path):
    """The protobuf records of a wandb run file: a 7-byte header (`:W&B`, magic, version), then LevelDB-log
    records in 32 KiB blocks (crc32c, length, type: full/first/middle/last)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left  # zero padding to the end of the block
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            record = Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_keeps_the_metrics_the_config_and_sample_tables(tmp_path, no_new_children):
    import json

    run = _run(tmp_path)
    trackers = Trackers.from_spec([WandbTrackerSpec(samples_every=2)], run)
    _feed(trackers, tmp_path)
    assert trackers.stats()["trackers/wandb/failed"] == 0.0
    [run_dir] = list((tmp_path / "wandb").glob("offline-run-*"))
    [run_file] = list(run_dir.glob("run-*.wandb"))
    history: dict[int, dict[str, float]] = {}
    config: dict[str, str] = {}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history[int(row["_step"])] = row
        elif kind == "run":
            assert record.run.display_name == "tracked" and record.run.project == "tgc-rl"
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    for step, metrics in STEPS.items():
        assert {k: history[step][k] for k in metrics} == metrics
    assert {k: v for k, v in config.items() if k != "_wandb"} == dict(run.params)
    assert history[2]["samples/_type"] == "table-file" and history[2]["samples/nrows"] == 3
    assert "samples/_type" not in history[1] | history[3]  # every samples_every=2 steps
    [table] = list(run_dir.glob("files/media/table/samples_2_*.table.json"))
    rows = json.loads(table.read_text())
    assert rows["columns"][:3] == ["step", "group", "index"] and len(rows["data"]) == 3


# -- a whole job -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_job_sends_its_metrics_jsonl_rows_to_mlflow_and_wandb(
    mlflow_server, ray_cluster, tmp_path, monkeypatch
):
    import json

    from mlflow.tracking import MlflowClient

    from tgc_rl.trainer.main import run

    from .conftest import read_metrics, tiny_spec

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    spec = tiny_spec(
        name="tracked-job",
        steps=3,
        trackers=[{"kind": "mlflow", "experiment": "tgc-job"}, {"kind": "wandb", "samples_every": 1}],
    )
    assert run(spec, tmp_path) == "succeeded"
    rows = {r["step"]: {k: v for k, v in r.items() if k != "step"} for r in read_metrics(tmp_path)}
    assert sorted(rows) == [1, 2, 3]
    assert rows[3]["trackers/mlflow/dropped"] == rows[3]["trackers/wandb/failed"] == 0.0

    client = MlflowClient(tracking_uri=mlflow_server)
    [found] = client.search_runs([client.get_experiment_by_name("tgc-job").experiment_id])
    assert found.info.status == "FINISHED" and found.data.tags["tgc.final_checkpoint"].endswith("step_3")
    keys = {k for r in rows.values() for k in r}
    assert set(found.data.metrics) == keys  # every metric of metrics.jsonl, under its own name
    for key in keys:  # and every value of every step
        got = {h.step: h.value for h in client.get_metric_history(found.info.run_id, key)}
        assert got == {s: r[key] for s, r in rows.items() if key in r}, key
    assert {"curves.png", "spec.yaml", "samples"} <= {
        a.path for a in client.list_artifacts(found.info.run_id)
    }

    [run_file] = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    history = {}
    for record in _wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history[int(row["_step"])] = row
    for step, metrics in rows.items():
        assert {k: history[step][k] for k in metrics} == pytest.approx(metrics), step
        assert history[step]["samples/_type"] == "table-file"
