from __future__ import annotations

import threading

import pytest
import yaml

from tgc_rl.config import JobSpec
from tgc_rl.sdk import Client, Conflict, Invalid, Job, NotFound, Unauthorized, WaitTimeout

SPEC = {"name": "sdk", "steps": 2, "group_size": 2, "prompts_per_step": 2}


@pytest.fixture
def acme(api_server):
    with Client(api_server.url, api_server.acme) as c:
        yield c


def test_submit_accepts_a_dict_a_jobspec_or_a_yaml_file(acme, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "name": "from-yaml"}))
    jobs = [acme.submit(SPEC), acme.submit(JobSpec.parse({**SPEC, "name": "typed"})), acme.submit(path)]
    assert [j.record.name for j in jobs] == ["sdk", "typed", "from-yaml"]
    assert all(isinstance(j, Job) and j.state.value == "queued" and j.record.tenant == "acme" for j in jobs)


def test_invalid_spec_raises_invalid_naming_the_fields(acme):
    with pytest.raises(Invalid) as e:
        acme.submit({"steps": -1, "group_size": 1})
    assert set(e.value.fields) == {"steps", "group_size"} and e.value.status == 422


def test_missing_token_raises_unauthorized(api_server):
    with Client(api_server.url, token="") as anonymous, pytest.raises(Unauthorized):
        anonymous.jobs()


def test_another_tenants_job_raises_not_found(api_server, acme):
    job = acme.submit(SPEC)
    with Client(api_server.url, api_server.globex) as globex, pytest.raises(NotFound):
        globex.job(job.id)


def test_refresh_reads_the_current_record(acme):
    job = acme.submit(SPEC)
    acme.job(job.id).cancel("from another handle")
    assert job.state.value == "queued" and job.refresh().state.value == "cancelled"


def test_cancel_of_an_ended_job_raises_conflict(acme):
    job = acme.submit(SPEC).cancel()
    assert job.done
    with pytest.raises(Conflict):
        job.cancel()


def test_wait_raises_wait_timeout_for_a_job_that_does_not_end(acme):
    with pytest.raises(WaitTimeout, match="still queued"):
        acme.submit(SPEC).wait(timeout=1.0, poll=0.2)


def test_wait_returns_once_the_job_ends(acme):
    job = acme.submit(SPEC)
    threading.Timer(0.5, lambda: acme.job(job.id).cancel()).start()
    assert job.wait(timeout=30, poll=0.1).state.value == "cancelled"


def test_stream_yields_the_events_until_the_job_ends(acme):
    job = acme.submit(SPEC)
    threading.Timer(0.5, lambda: acme.job(job.id).cancel("bye")).start()
    events = list(job.stream())
    assert [e.data["state"] for e in events if e.type == "state"] == ["queued", "cancelled"]
    assert job.done  # the record was refreshed at the end of the stream


def test_same_idempotency_key_gives_the_same_job(acme):
    a = acme.submit(SPEC, idempotency_key="sdk-key")
    b = acme.submit(SPEC, idempotency_key="sdk-key")
    assert a.id == b.id


def test_jobs_follows_pages(api_server):
    with Client(api_server.url, api_server.cp.create_token("pages")) as c:
        ids = [c.submit({**SPEC, "name": f"p{i}"}).id for i in range(5)]
        assert [j.id for j in c.iter_jobs(page_size=2)] == ids[::-1]
        assert [j.id for j in c.jobs(limit=3)] == ids[::-1][:3]
        c.job(ids[0]).cancel()
        assert [j.id for j in c.jobs(state="cancelled")] == [ids[0]]


def test_metrics_checkpoints_and_logs_of_a_queued_job_are_empty(acme):
    job = acme.submit(SPEC)
    assert job.metrics() == [] and job.checkpoints() == [] and job.logs().lines == []


def test_validate_returns_the_normalized_spec_and_stores_nothing(acme):
    before = len(acme.jobs(limit=None))
    spec = acme.validate(SPEC)
    assert spec["objective"]["name"] == "cp_grpo" and len(acme.jobs(limit=None)) == before


def test_schema_is_the_job_spec_schema(acme):
    assert acme.schema() == JobSpec.model_json_schema(by_alias=True)
