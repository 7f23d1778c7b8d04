"""`GET /v1/jobs/{id}/samples`, the SDK's `Job.samples` and `tgc samples`, on a control plane without Ray,
reading trace files that TraceWriter (what the trainer runs) put in a job's run directory."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.servers import arm, auth
from tgc_rl.batch import Completion
from tgc_rl.cli import main
from tgc_rl.config import TracesSpec
from tgc_rl.sdk import Client, NotFound, TraceRecord
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.trainer.data import Prompt
from tgc_rl.trainer.loop import Group
from tgc_rl.trainer.traces import TRACES_DIR, TraceWriter, trace_files

SPEC = {"name": "traced", "steps": 3, "group_size": 4, "prompts_per_step": 3}
STEPS = 3


def _groups(step: int) -> list[Group]:
    out = []
    for g in range(3):
        comps = [Completion([g, i], [-0.1, -0.2], "stop", step - 1) for i in range(4)]
        scores = [Score(float(i == g), "ok", f"verdict {i}") for i in range(4)]
        text = f"what is {step}+{g}?\x1b[31m"  # an escape sequence, as model output may hold one
        out.append(Group(Prompt(10 * step + g, TaskItem(id=f"{step}.{g}", prompt=text), [1]), comps, scores))
    return out


def _started_job(api_server, token: str, run_dir: Path) -> str:
    """A job the scheduler would have started: its record names `run_dir` (the server here runs no Ray)."""
    r = httpx.post(f"{api_server.url}/v1/jobs", json=SPEC, headers=auth(token))
    r.raise_for_status()
    arm(api_server, r.json()["id"], run_dir)
    return r.json()["id"]


@pytest.fixture(scope="module")
def traced(api_server, tmp_path_factory) -> tuple[str, list[dict]]:
    """A started job of tenant acme whose run directory holds three steps of traces; and what they hold."""
    run_dir = tmp_path_factory.mktemp("run")
    writer = TraceWriter(run_dir, TracesSpec(steps_per_file=2))
    for step in range(1, STEPS + 1):
        writer.add_step(step, _groups(step), [0.5] * 12, lambda ids: f"answer {ids}")
    writer.close()
    written = [
        json.loads(ln) for _, p in trace_files(run_dir / TRACES_DIR) for ln in p.read_text().splitlines()
    ]
    return _started_job(api_server, api_server.acme, run_dir), written


def _get(api_server, job_id: str, token: str, **params) -> httpx.Response:
    return httpx.get(f"{api_server.url}/v1/jobs/{job_id}/samples", params=params, headers=auth(token))


def test_pages_follow_the_cursor_through_every_stored_sample(api_server, traced):
    job_id, written = traced
    seen, cursor = [], None
    for _ in range(100):
        body = _get(
            api_server, job_id, api_server.acme, limit=7, **({"cursor": cursor} if cursor else {})
        ).json()
        assert len(body["samples"]) <= 7 and body["last_step"] == STEPS
        seen += body["samples"]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == written and len(written) > 7


def test_filters_by_step_group_and_reason(api_server, traced):
    job_id, written = traced
    body = _get(api_server, job_id, api_server.acme, step=2, selected="worst", limit=200).json()
    assert [(s["step"], s["group"]) for s in body["samples"]] == [(2, 0), (2, 1), (2, 2)]
    assert all("worst" in s["selected"] and s["reward"] == 0.0 for s in body["samples"])
    body = _get(api_server, job_id, api_server.acme, group=1, limit=200).json()
    assert body["samples"] == [s for s in written if s["group"] == 1]


def test_another_tenants_job_is_a_404_and_an_admin_sees_it(api_server, traced):
    job_id, _ = traced
    r = _get(api_server, job_id, api_server.globex)
    assert r.status_code == 404 and "samples" not in r.json()
    assert _get(api_server, job_id, api_server.admin).json()["samples"]


def test_a_job_not_started_has_no_samples(api_server):
    r = httpx.post(f"{api_server.url}/v1/jobs", json=SPEC, headers=auth(api_server.acme)).json()
    body = _get(api_server, r["id"], api_server.acme).json()
    assert body == {"job_id": r["id"], "samples": [], "next_cursor": None, "last_step": None}


@pytest.mark.parametrize(
    "param, value",
    [
        ("limit", 0),
        ("limit", 201),
        ("cursor", "3.1"),
        ("cursor", "../x"),
        ("step", -1),
        ("selected", "nice"),
        ("group", "x"),
    ],
)
def test_bad_parameters_are_422_naming_them(api_server, traced, param, value):
    r = _get(api_server, traced[0], api_server.acme, **{param: value})
    assert r.status_code == 422 and [d["field"] for d in r.json()["detail"]] == [param]


def test_the_endpoint_is_documented_with_its_errors(api_server):
    doc = httpx.get(f"{api_server.url}/openapi.json").json()
    op = doc["paths"]["/v1/jobs/{job_id}/samples"]["get"]
    assert {"401", "404", "422", "429"} <= set(op["responses"])
    assert {p["name"] for p in op["parameters"]} == {"job_id", "step", "group", "selected", "limit", "cursor"}


def test_the_sdk_returns_typed_records(api_server, traced):
    job_id, written = traced
    with Client(api_server.url, api_server.acme) as client:
        page = client.job(job_id).samples(step=STEPS, limit=200)
        assert all(isinstance(s, TraceRecord) for s in page.samples)
        assert [s.model_dump() for s in page.samples] == [s for s in written if s["step"] == STEPS]
        assert page.next_cursor is None and page.last_step == STEPS
    with Client(api_server.url, api_server.globex) as other, pytest.raises(NotFound):
        other.job(job_id).samples()


def test_tgc_samples_shows_the_newest_steps_worst_responses_without_escape_sequences(
    api_server, traced, capsys
):
    job_id, _ = traced
    assert main(["samples", job_id, "--worst", "--url", api_server.url, "--token", api_server.acme]) == 0
    out = capsys.readouterr().out
    assert f"step {STEPS} group 0 #1" in out and f"step {STEPS} group 1 #0" in out  # each group's worst
    assert "step 2 " not in out and "verdict" in out and f"what is {STEPS}+2?" in out
    assert "\x1b" not in out and "\\x1b[31m" in out
    assert (
        main(
            [
                "samples",
                job_id,
                "--step",
                "1",
                "--limit",
                "2",
                "--json",
                "--url",
                api_server.url,
                "--token",
                api_server.acme,
            ]
        )
        == 0
    )
    page = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in page["samples"]] == [1, 1] and page["next_cursor"] == "1.0.1"
    assert (
        main(["samples", job_id, "--limit", "500", "--url", api_server.url, "--token", api_server.acme]) != 0
    )
    assert "limit" in capsys.readouterr().err
