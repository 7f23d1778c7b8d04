"""Testbed 3 end to end with the tiny random-init model: through the real trainer here, and as a sweep of
control-plane jobs (real FastAPI server on loopback, real SQLite, real local Ray head, real trainer)."""

import json

import pytest

from experiments.report import load_results, write_report

pytestmark = pytest.mark.slow


def _check_results(path):
    results = json.loads(path.read_text())
    assert results["testbed"] == "trainer" and results["size"] == "tiny"
    assert {c["objective"] for c in results["conditions"]} == {"grpo", "cp_grpo"}
    for cond in results["conditions"]:
        assert cond["seeds"] == [0]
        assert cond["curves"]["reward/accuracy"]["x"] == [1, 2]  # both steps of every run were collected
        assert cond["final"]["diag/d7_entropy_mean"][0] > 0
    return results


def test_local_study_runs_every_job_through_the_trainer(tmp_path):
    from experiments.trainer_study import run_local

    out = run_local("tiny", tmp_path / "results", cache=tmp_path / "cache")
    _check_results(out)
    assert sorted(p.name for p in (tmp_path / "results" / "trainer_tiny_runs").iterdir()) == [
        "tgc-exp-cp-grpo-arithmetic-s0.json",
        "tgc-exp-grpo-arithmetic-s0.json",
    ]
    # resumable on another machine: the per-run summaries travel with the results, so a second invocation
    # with an empty cache reuses the finished runs instead of training again
    lines = []
    again = run_local("tiny", tmp_path / "results", cache=tmp_path / "fresh-cache", log=lines.append)
    assert not any("starting" in line for line in lines)
    assert json.loads(again.read_text())["conditions"] == json.loads(out.read_text())["conditions"]


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    from tests.servers import control_plane_with_ray

    with control_plane_with_ray(tmp_path_factory.mktemp("sweep-plane")) as cp:
        yield cp


def test_sweep_submits_one_job_per_run_and_collects_them_into_the_report(plane, tmp_path):
    from experiments.sweep import collect, submit
    from tgc_rl.sdk import Client

    manifest = tmp_path / "manifest.json"
    with Client(plane.url, plane.create_token("experiments")) as client:
        data = submit(client, "tiny", manifest, name_prefix="sweep", log=lambda msg: None)
        assert len({run["job_id"] for run in data["runs"]}) == 2
        out = collect(client, manifest, tmp_path / "results", timeout=900, log=lambda msg: None)
    _check_results(out)
    report = write_report(tmp_path / "results", tmp_path / "results" / "REPORT.md")
    assert "trainer" in load_results(tmp_path / "results")
    assert "Testbed 3 (real trainer)" in report.read_text()
