"""The REST API against a real server (uvicorn child process, SQLite) without Ray: jobs stay queued."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from tests.servers import arm, auth
from tgc_rl.trainer.reporting import Reporter

TINY = {"name": "tiny", "steps": 3, "group_size": 2, "prompts_per_step": 2}


def submit(http, token: str, spec: dict | None = None, **headers: str) -> httpx.Response:
    return http.post("/v1/jobs", json=spec or TINY, headers={**auth(token), **headers})


def reporter(api_server, job_id: str, secret: str, run_dir: Path) -> Reporter:
    return Reporter(run_dir, api_server.url, job_id, secret)


# -- auth -----------------------------------------------------------------------------------------
def test_request_without_token_is_401(http):
    r = http.get("/v1/jobs")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"] == "unauthorized"


def test_invalid_token_is_401(http):
    assert http.get("/v1/jobs", headers=auth("tgc_not-a-token")).status_code == 401


def test_another_tenants_job_is_404_everywhere(http, api_server):
    job_id = submit(http, api_server.acme).json()["id"]
    for method, path in [
        ("GET", ""),
        ("POST", "/cancel"),
        ("GET", "/metrics"),
        ("GET", "/logs"),
        ("GET", "/checkpoints"),
        ("GET", "/events"),
        ("POST", "/resume"),
    ]:
        r = http.request(method, f"/v1/jobs/{job_id}{path}", headers=auth(api_server.globex))
        assert r.status_code == 404, (method, path, r.text)
    assert http.get(f"/v1/jobs/{job_id}", headers=auth(api_server.acme)).json()["state"] == "queued"


def test_tenant_lists_only_its_own_jobs(http, api_server):
    mine = submit(http, api_server.globex).json()["id"]
    listed = {j["id"] for j in http.get("/v1/jobs", headers=auth(api_server.globex)).json()["jobs"]}
    assert mine in listed and all(
        j["tenant"] == "globex" for j in http.get("/v1/jobs", headers=auth(api_server.globex)).json()["jobs"]
    )


def test_admin_sees_every_tenants_jobs(http, api_server):
    a = submit(http, api_server.acme).json()["id"]
    g = submit(http, api_server.globex).json()["id"]
    listed = {
        j["id"]
        for j in http.get("/v1/jobs", params={"limit": 500}, headers=auth(api_server.admin)).json()["jobs"]
    }
    assert {a, g} <= listed
    assert http.get(f"/v1/jobs/{g}", headers=auth(api_server.admin)).status_code == 200


def test_tenant_cannot_list_another_tenant_by_filter(http, api_server):
    assert http.get("/v1/jobs", params={"tenant": "globex"}, headers=auth(api_server.acme)).status_code == 403


# -- submission -----------------------------------------------------------------------------------
def test_submit_returns_the_record_with_the_full_spec_and_owner(http, api_server):
    r = submit(http, api_server.acme)
    assert r.status_code == 201 and r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
    body = r.json()
    assert body["tenant"] == "acme" and body["state"] == "queued" and body["total_steps"] == 3
    assert body["spec"]["objective"]["name"] == "cp_grpo"  # defaults filled in
    assert body["transitions"][0]["state"] == "queued"


def test_invalid_spec_is_422_naming_each_field(http, api_server):
    r = submit(http, api_server.acme, {"steps": -1, "sampling": {"max_new_tokens": -1}, "colour": "red"})
    assert r.status_code == 422
    fields = {d["field"]: d["msg"] for d in r.json()["detail"]}
    assert set(fields) == {"steps", "sampling.max_new_tokens", "colour"}
    assert "unknown field" in fields["colour"]


def test_unknown_objective_is_422_listing_the_choices(http, api_server):
    r = submit(http, api_server.acme, {"objective": {"name": "magic"}})
    assert r.status_code == 422 and "cp_grpo" in r.json()["detail"][0]["msg"]


def test_bad_objective_override_is_422_before_anything_runs(http, api_server):
    r = submit(http, api_server.acme, {"objective": {"name": "cp_grpo", "overrides": {"clip_hgih": 0.3}}})
    assert r.status_code == 422
    detail = r.json()["detail"][0]
    assert detail["field"] == "objective.overrides" and "clip_high" in detail["msg"]


def test_spec_value_over_the_server_limit_is_422_with_the_field(http, api_server):
    r = submit(http, api_server.acme, {"resources": {"learner_ranks": 40, "rollout_replicas": 40}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "resources"


def test_body_over_the_size_limit_is_413(http, api_server):
    big = {"name": "big", "task": {"params": {"blob": "x" * (2 * 2**20)}}}
    r = submit(http, api_server.acme, big)
    assert r.status_code == 413 and "exceeds the limit" in r.json()["message"]


def test_chunked_body_over_the_size_limit_is_413(http, api_server):
    def chunks():
        yield b'{"name": "big", "task": {"params": {"blob": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}}}'

    r = http.post(
        "/v1/jobs", content=chunks(), headers={**auth(api_server.acme), "Content-Type": "application/json"}
    )
    assert r.status_code == 413


def test_idempotency_key_replays_return_the_first_job(http, api_server):
    first = submit(http, api_server.acme, **{"Idempotency-Key": "abc-1"})
    again = submit(http, api_server.acme, **{"Idempotency-Key": "abc-1"})
    assert first.status_code == 201 and again.status_code == 200 and again.json()["id"] == first.json()["id"]


def test_idempotency_key_with_another_spec_is_409(http, api_server):
    submit(http, api_server.acme, **{"Idempotency-Key": "abc-2"})
    r = submit(http, api_server.acme, {**TINY, "steps": 9}, **{"Idempotency-Key": "abc-2"})
    assert r.status_code == 409 and r.json()["error"] == "conflict"


def test_dry_run_validates_and_stores_nothing(http, api_server):
    before = len(http.get("/v1/jobs", params={"limit": 500}, headers=auth(api_server.admin)).json()["jobs"])
    r = http.post("/v1/jobs", params={"dry_run": "true"}, json=TINY, headers=auth(api_server.acme))
    assert r.status_code == 200 and r.json() == {"valid": True, "spec": r.json()["spec"]}
    after = len(http.get("/v1/jobs", params={"limit": 500}, headers=auth(api_server.admin)).json()["jobs"])
    assert after == before


# -- listing --------------------------------------------------------------------------------------
def test_pages_cover_all_jobs_once(http, api_server):
    token = api_server.cp.create_token("pager")
    ids = [submit(http, token, {**TINY, "name": f"p{i}"}).json()["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = http.get("/v1/jobs", params=params, headers=auth(token)).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids[::-1]


def test_state_filter(http, api_server):
    token = api_server.cp.create_token("filters")
    a = submit(http, token).json()["id"]
    b = submit(http, token).json()["id"]
    http.post(f"/v1/jobs/{a}/cancel", headers=auth(token))
    cancelled = http.get("/v1/jobs", params={"state": "cancelled"}, headers=auth(token)).json()["jobs"]
    queued = http.get("/v1/jobs", params={"state": "queued"}, headers=auth(token)).json()["jobs"]
    assert [j["id"] for j in cancelled] == [a] and [j["id"] for j in queued] == [b]


# -- control --------------------------------------------------------------------------------------
def test_cancel_of_a_queued_job_ends_it_and_a_second_cancel_is_409(http, api_server):
    job_id = submit(http, api_server.acme).json()["id"]
    r = http.post(
        f"/v1/jobs/{job_id}/cancel", json={"reason": "changed my mind"}, headers=auth(api_server.acme)
    )
    assert (
        r.status_code == 202 and r.json()["state"] == "cancelled" and "changed my mind" in r.json()["reason"]
    )
    assert http.post(f"/v1/jobs/{job_id}/cancel", headers=auth(api_server.acme)).status_code == 409


def test_resume_without_a_checkpoint_is_409(http, api_server):
    job_id = submit(http, api_server.acme).json()["id"]
    http.post(f"/v1/jobs/{job_id}/cancel", headers=auth(api_server.acme))
    r = http.post(f"/v1/jobs/{job_id}/resume", headers=auth(api_server.acme))
    assert r.status_code == 409 and "no checkpoint" in r.json()["message"]


def test_resume_of_a_queued_job_is_409(http, api_server):
    job_id = submit(http, api_server.acme).json()["id"]
    assert http.post(f"/v1/jobs/{job_id}/resume", headers=auth(api_server.acme)).status_code == 409


# -- trainer reports ------------------------------------------------------------------------------
def test_reports_need_the_jobs_own_token(http, api_server, tmp_path):
    a = submit(http, api_server.acme).json()["id"]
    b = submit(http, api_server.acme).json()["id"]
    secret_a = arm(api_server, a, tmp_path / "a")
    arm(api_server, b, tmp_path / "b")
    batch = {"events": [{"type": "log", "time": time.time(), "message": "hi"}]}
    url = "/v1/internal/jobs/{}/events"
    assert http.post(url.format(a), json=batch).status_code == 401
    assert http.post(url.format(a), json=batch, headers=auth(api_server.acme)).status_code == 401
    assert http.post(url.format(b), json=batch, headers=auth(secret_a)).status_code == 401
    assert http.post(url.format(a), json=batch, headers=auth(secret_a)).status_code == 200


def test_malformed_report_is_422_naming_the_event_field(http, api_server, tmp_path):
    job_id = submit(http, api_server.acme).json()["id"]
    secret = arm(api_server, job_id, tmp_path)
    batch = {"events": [{"type": "step", "time": 1.0, "step": -1, "metrics": {}}]}
    r = http.post(f"/v1/internal/jobs/{job_id}/events", json=batch, headers=auth(secret))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "events[0].step"


def test_reported_progress_is_served_as_metrics_logs_checkpoints_and_record(http, api_server, tmp_path):
    job_id = submit(http, api_server.acme).json()["id"]
    rep = reporter(api_server, job_id, arm(api_server, job_id, tmp_path), tmp_path)
    rep.state("running", "started", 0)
    for step in (1, 2):
        rep.step(step, {"reward_mean": step / 4, "loss": 1.0 / step})
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)
    rep.checkpoint(2, tmp_path / "checkpoints" / "step_2")
    rep.log("halfway")
    h = auth(api_server.acme)
    record = http.get(f"/v1/jobs/{job_id}", headers=h).json()
    assert record["state"] == "running" and record["step"] == 2
    assert record["latest_metrics"] == {"reward_mean": 0.5, "loss": 0.5}
    points = http.get(f"/v1/jobs/{job_id}/metrics", params={"since_step": 2}, headers=h).json()["points"]
    assert [(p["step"], p["metrics"]["reward_mean"]) for p in points] == [(2, 0.5)]
    assert [ln["message"] for ln in http.get(f"/v1/jobs/{job_id}/logs", headers=h).json()["lines"]] == [
        "halfway"
    ]
    ckpts = http.get(f"/v1/jobs/{job_id}/checkpoints", headers=h).json()["checkpoints"]
    assert [(c["step"], c["exists"]) for c in ckpts] == [(2, True)]


def test_report_with_nan_metrics_as_python_json_writes_them_is_stored_as_null(http, api_server, tmp_path):
    job_id = submit(http, api_server.acme).json()["id"]
    secret = arm(api_server, job_id, tmp_path)
    body = '{"events": [{"type": "step", "time": 1.0, "step": 1, "metrics": {"loss": NaN, "kl": Infinity}}]}'
    r = http.post(
        f"/v1/internal/jobs/{job_id}/events",
        content=body,
        headers={**auth(secret), "Content-Type": "application/json"},
    )
    assert r.status_code == 200
    points = http.get(f"/v1/jobs/{job_id}/metrics", headers=auth(api_server.acme)).json()["points"]
    assert points[0]["metrics"] == {"loss": None, "kl": None}


def test_cancel_is_answered_to_the_trainers_next_report(http, api_server, tmp_path):
    job_id = submit(http, api_server.acme).json()["id"]
    rep = reporter(api_server, job_id, arm(api_server, job_id, tmp_path), tmp_path)
    rep.state("running", "started", 0)
    assert rep.cancel_requested is None
    r = http.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "stop now"}, headers=auth(api_server.acme))
    assert r.json()["state"] == "running" and r.json()["cancel_requested"]
    rep.step(1, {})
    assert rep.cancel_requested == "stop now"
    rep.state("cancelled", "stop now", 1)
    record = http.get(f"/v1/jobs/{job_id}", headers=auth(api_server.acme)).json()
    assert record["state"] == "cancelled" and "last step 1" in record["reason"]


def test_event_stream_delivers_state_steps_and_logs_then_ends(http, api_server, tmp_path):
    job_id = submit(http, api_server.acme).json()["id"]
    rep = reporter(api_server, job_id, arm(api_server, job_id, tmp_path), tmp_path)

    def train() -> None:
        time.sleep(0.5)
        rep.state("running", "started", 0)
        rep.step(1, {"loss": 1.0})
        rep.log("done soon")
        rep.state("succeeded", "completed all steps", 1)

    t = threading.Thread(target=train)
    t.start()
    events = []
    with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=auth(api_server.acme)) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
    t.join()
    assert events[-1] == "end"
    assert {"state", "step", "log"} <= set(events)
    assert events.index("step") < events.index("log")


def test_event_stream_resumes_after_last_event_id(http, api_server):
    job_id = submit(http, api_server.acme).json()["id"]
    http.post(f"/v1/jobs/{job_id}/cancel", headers=auth(api_server.acme))
    r = http.get(f"/v1/jobs/{job_id}/events", params={"follow": "false"}, headers=auth(api_server.acme))
    ids = [int(line[4:]) for line in r.text.splitlines() if line.startswith("id: ")]
    assert len(ids) >= 2 and ids == sorted(ids)
    r2 = http.get(
        f"/v1/jobs/{job_id}/events", headers={**auth(api_server.acme), "Last-Event-ID": str(ids[0])}
    )
    assert [int(line[4:]) for line in r2.text.splitlines() if line.startswith("id: ")] == ids[1:]


# -- ops ------------------------------------------------------------------------------------------
def test_health_and_readiness(http):
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["db"] == "ok"


def test_prometheus_metrics_count_jobs_requests_and_training_gauges(http, api_server, tmp_path):
    job_id = submit(http, api_server.acme).json()["id"]
    rep = reporter(api_server, job_id, arm(api_server, job_id, tmp_path), tmp_path)
    rep.state("running", "started", 0)
    rep.step(1, {"reward_mean": 0.75})
    text = http.get("/metrics", headers=auth(api_server.admin)).text
    assert 'tgc_jobs{state="queued"}' in text and 'tgc_job_submissions_total{tenant="acme"}' in text
    assert 'tgc_http_request_duration_seconds_count{method="POST",route="/v1/jobs",status="201"}' in text
    assert f'tgc_job_train_metric{{job_id="{job_id}",metric="reward_mean",tenant="acme"}} 0.75' in text
    assert f'tgc_job_step{{job_id="{job_id}",name="tiny",tenant="acme"}} 1.0' in text


def test_openapi_documents_the_job_spec_as_the_submit_body(http):
    doc = http.get("/openapi.json").json()
    body = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/JobSpec")
    assert "async" in doc["components"]["schemas"]["JobSpec"]["properties"]
    assert "HTTPBearer" in doc["components"]["securitySchemes"]


def test_tokens_never_appear_in_the_server_log(api_server):
    log = api_server.cp.log_path.read_text()
    for secret in (api_server.acme, api_server.globex, api_server.admin):
        assert secret not in log
