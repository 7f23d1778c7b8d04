"""The trust boundary, tried as a hostile tenant would: one test (or property) per class of hole.

Classes: privilege escalation through free-form fields (the sandbox switched off, host files read, code
imported); numbers out of range in queries and headers, and unknown query parameters; non-finite floats;
deep nesting; specs accepted that cannot start; templates filled by str.format; spec sections beyond the
free-form size cap; /metrics leaking tenants or growing a label per client whim; names with a trailing
newline.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.servers import auth
from tgc_rl.config import JobSpec, SpecError
from tgc_rl.control.db import make_engine
from tgc_rl.control.policy import PolicyError, check_spec
from tgc_rl.control.settings import ControlSettings
from tgc_rl.control.store import JobStore
from tgc_rl.control.tokens import TokenStore
from tgc_rl.tasks import load_task
from tgc_rl.tasks.grants import LOCAL_GRANTS, PRIVILEGES, UNSAFE_SANDBOX, GrantError
from tgc_rl.tasks.registry import params_model
from tgc_rl.trainer.main import check_grants


@pytest.fixture(scope="module")
def store(api_server):
    """The server's own database, read beside it."""
    engine = make_engine(f"sqlite:///{(api_server.cp.data_dir / 'tgc.db').resolve()}")
    yield JobStore(engine)
    engine.dispose()


def post_raw(http, token: str, body: str, dry_run: bool = False) -> httpx.Response:
    return http.post(
        "/v1/jobs" + ("?dry_run=true" if dry_run else ""),
        content=body,
        headers={**auth(token), "Content-Type": "application/json"},
    )


# -- 1. privileges: decided by the operator, re-checked by the worker ---------------------------------
UNSAFE_SPECS = [
    {"task": {"name": "code", "params": {"sandbox": "unsafe_local"}}},
    {
        "task": {
            "name": "humaneval",
            "params": {"sandbox": "unsafe_local", "instruction": "Answer.\n{prompt}"},
        }
    },
]


@pytest.mark.parametrize("spec", UNSAFE_SPECS)
def test_a_tenant_cannot_switch_the_sandbox_off(http, api_server, spec):
    r = http.post("/v1/jobs", json=spec, headers=auth(api_server.acme))
    assert r.status_code == 422, r.text
    assert [d["field"] for d in r.json()["detail"]] == ["task.params.sandbox"]
    assert "operator" in r.json()["detail"][0]["msg"]


def test_an_admin_may_and_the_job_records_exactly_that_grant(http, api_server, store):
    r = http.post("/v1/jobs", json=UNSAFE_SPECS[0], headers=auth(api_server.admin))
    assert r.status_code == 201, r.text
    assert store.get(r.json()["id"]).grants == UNSAFE_SANDBOX
    plain = http.post("/v1/jobs", json={"steps": 1}, headers=auth(api_server.admin)).json()
    assert store.get(plain["id"]).grants == ""  # an admin's job gets only what it uses


def test_the_operator_setting_grants_it_to_every_tenant():
    spec = JobSpec.parse(UNSAFE_SPECS[0])
    with pytest.raises(PolicyError):
        check_spec(spec, ControlSettings(), is_admin=False)
    assert check_spec(spec, ControlSettings(allow_unsafe_sandbox=True), is_admin=False) == UNSAFE_SANDBOX
    with pytest.raises(PolicyError):  # allowing custom code does not allow an unconfined sandbox
        check_spec(spec, ControlSettings(allow_custom_code=True), is_admin=False)


def test_the_worker_refuses_an_ungranted_unsafe_sandbox_whatever_the_spec_says():
    with pytest.raises(GrantError, match="task.params.sandbox"):
        load_task("code", {"sandbox": "unsafe_local"}, 0)
    with pytest.raises(GrantError, match="task.params.sandbox"):
        load_task("humaneval", {"sandbox": "unsafe_local"}, 0, grants=LOCAL_GRANTS)
    assert (
        load_task("code", {"sandbox": "unsafe_local"}, 0, grants=frozenset({UNSAFE_SANDBOX})).sandbox_mode
        == "unsafe_local"
    )


def test_a_control_plane_job_gets_only_its_recorded_grants(monkeypatch):
    spec = JobSpec.parse({**UNSAFE_SPECS[0], "model": {"source": "/srv/models/x"}})
    monkeypatch.setenv("TGC_GRANTS", "")  # what the scheduler sets for a job granted nothing
    with pytest.raises(GrantError, match="task.params.sandbox needs the grant 'unsafe_sandbox'"):
        check_grants(spec)
    with pytest.raises(GrantError, match="custom code"):
        load_task("tgc_rl.tasks.arithmetic:ArithmeticTask", {}, 0, grants=frozenset())
    monkeypatch.setenv("TGC_GRANTS", "unsafe_sandbox,host_paths,bogus")
    check_grants(spec)
    monkeypatch.delenv("TGC_GRANTS")  # a local run: the operator's own code and files, never unconfined
    with pytest.raises(GrantError, match="unsafe_sandbox"):
        check_grants(spec)


def test_the_scheduler_hands_the_job_its_grants(api_server, http, store):
    from tgc_rl.control.scheduler import Scheduler

    job = http.post("/v1/jobs", json=UNSAFE_SPECS[0], headers=auth(api_server.admin)).json()
    row = store.get(job["id"])
    store.update(
        row.id, run_dir=str(api_server.cp.data_dir / "runs" / row.id), ray_submission_id=f"sub-{row.id}"
    )

    class RecordingRay:  # stands in for Ray's Jobs API: only what the scheduler hands over is checked
        def submit(self, sub_id, entrypoint, env_vars, metadata):
            self.env = env_vars

    settings = ControlSettings(
        data_dir=api_server.cp.data_dir,
        ray_address="none",
        trainer_env={"TGC_GRANTS": "custom_code,host_paths,unsafe_sandbox"},
    )
    scheduler = Scheduler(store, TokenStore(store.engine), settings, telemetry=None)
    scheduler.ray = RecordingRay()
    scheduler._submit(store.get(row.id))
    assert scheduler.ray.env["TGC_GRANTS"] == UNSAFE_SANDBOX  # the operator's trainer_env cannot widen it


@pytest.mark.parametrize(
    "spec, field",
    [
        (
            {"task": {"name": "reasoning_gym:spell_backward", "params": {"data_file": "/etc/passwd"}}},
            "data_file",
        ),
        (
            {
                "task": {
                    "name": "reasoning_gym:spell_backward",
                    "params": {"data_file": "../../../../etc/passwd"},
                }
            },
            "data_file",
        ),
        ({"task": {"name": "reasoning_gym:composite", "params": {}}}, "composite"),
        (
            {
                "task": {
                    "name": "humaneval",
                    "params": {"instruction": "{prompt.__class__.__init__.__globals__}"},
                }
            },
            "instruction",
        ),
        (
            {"task": {"name": "humaneval", "params": {"instruction": "{prompt}{prompt.__class__}"}}},
            "instruction",
        ),
        ({"task": {"name": "arithmetic", "params": {"template": "{a.__class__.__mro__} {b}"}}}, "template"),
        (
            {
                "model": {
                    "source": "smollm2-135m-instruct",
                    "config_overrides": {"auto_map": {"AutoModel": "x.y"}},
                }
            },
            "config_overrides",
        ),
        (
            {"model": {"source": "random", "config_overrides": {"auto_map": {"AutoModel": "evil.Model"}}}},
            "auto_map",
        ),
        (
            {"model": {"source": "random", "config_overrides": {"trust_remote_code": True}}},
            "trust_remote_code",
        ),
        ({"name": "../../etc"}, "name"),
        ({"name": "run\n"}, "name"),
    ],
)
def test_free_form_fields_cannot_read_host_files_or_reach_code(http, api_server, spec, field):
    r = http.post("/v1/jobs?dry_run=true", json=spec, headers=auth(api_server.acme))
    assert r.status_code == 422 and field in r.text, r.text


def test_host_paths_and_custom_code_need_an_admin(http, api_server):
    for spec, field in [
        ({"model": {"source": "/etc"}}, "model.source"),
        ({"model": {"tokenizer": "/root"}}, "model.tokenizer"),
        ({"task": {"name": "os:system"}}, "task.name"),
        ({"task": {"reward": "os:system"}}, "task.reward"),
    ]:
        r = http.post("/v1/jobs?dry_run=true", json=spec, headers=auth(api_server.acme))
        assert r.status_code == 422 and [d["field"] for d in r.json()["detail"]] == [field], r.text


# -- 2. numbers out of range in queries and headers ----------------------------------------------------
HUGE = "9" * 20


@pytest.mark.parametrize("query", [f"cursor={HUGE}", "cursor=²", "cursor=-1", "cursor=1e3"])
def test_list_cursor_is_parsed_and_bounded(http, api_server, query):
    r = http.get(f"/v1/jobs?{query}", headers=auth(api_server.acme))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "cursor", r.text


@pytest.mark.parametrize(
    "path, field",
    [
        ("logs?since={}", "since"),
        ("metrics?since_step={}", "since_step"),
        ("metrics?attempt={}", "attempt"),
        ("logs?source=driver&attempt={}", "attempt"),
        ("events?follow=false&since={}", "since"),
    ],
)
@pytest.mark.parametrize("value", [HUGE, "²", "-5", "NaN"])
def test_job_query_numbers_are_parsed_and_bounded(http, api_server, path, field, value):
    job = http.post("/v1/jobs", json={"steps": 1}, headers=auth(api_server.acme)).json()["id"]
    r = http.get(f"/v1/jobs/{job}/" + path.format(value), headers=auth(api_server.acme))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == field, r.text


@pytest.mark.parametrize("value", [HUGE.encode(), "²".encode(), b"-1", b"abc"])
def test_last_event_id_is_parsed_and_bounded(http, api_server, value):
    job = http.post("/v1/jobs", json={"steps": 1}, headers=auth(api_server.acme)).json()["id"]
    r = http.get(
        f"/v1/jobs/{job}/events?follow=false", headers={**auth(api_server.acme), "Last-Event-ID": value}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "Last-Event-ID", r.text


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(value=st.one_of(st.integers(), st.text(max_size=30), st.floats(allow_nan=True)))
def test_no_query_number_makes_the_server_fail(http, api_server, value):
    job = http.post("/v1/jobs", json={"steps": 1}, headers=auth(api_server.acme)).json()["id"]
    for path, name in [
        ("/v1/jobs", "cursor"),
        (f"/v1/jobs/{job}/logs", "since"),
        (f"/v1/jobs/{job}/metrics", "since_step"),
        (f"/v1/jobs/{job}/metrics", "attempt"),
        (f"/v1/jobs/{job}/events", "since"),
    ]:
        params = {name: str(value), **({"follow": "false"} if path.endswith("/events") else {})}
        r = http.get(path, params=params, headers=auth(api_server.acme))
        assert r.status_code in (200, 422), (path, value, r.status_code, r.text[:300])
        if r.status_code == 422:
            assert [d["field"] for d in r.json()["detail"]] == [name], r.text[:300]


@pytest.mark.parametrize(
    "path, query",
    [
        ("/v1/jobs", "stat=failed"),  # a misspelt filter once listed every job
        ("/v1/jobs", "limit=5&x-unknown=1"),
        ("/v1/jobs/{job}/logs", "sicne=5"),
        ("/v1/jobs/{job}", "follow=false"),
        ("/v1/datasets", "tenant=globex"),
        ("/healthz", "x=1"),
    ],
)
def test_unknown_query_parameters_are_refused_naming_them(http, api_server, path, query):
    job = http.post("/v1/jobs", json={"steps": 1}, headers=auth(api_server.acme)).json()["id"]
    r = http.get(path.format(job=job) + "?" + query, headers=auth(api_server.acme))
    unknown = query.split("&")[-1].split("=")[0]
    assert r.status_code == 422, r.text[:300]
    assert [d["field"] for d in r.json()["detail"]] == [unknown] and "remove" in r.json()["message"], r.text[
        :300
    ]


# -- 3/4/5. non-finite floats, deep nesting, specs that could not start ---------------------------------
BAD_BODIES = {
    "optim.grad_clip": '{"optim": {"grad_clip": Infinity}}',
    "resources.cpus_per_learner": '{"resources": {"cpus_per_learner": Infinity}}',
    "optim.betas.0": '{"optim": {"betas": [NaN, 0.9]}}',
    "task.params": '{"task": {"name": "reasoning_gym:basic_arithmetic", "params": {"min_terms": NaN}}}',
    "model.config_overrides": '{"model": {"source": "random", "config_overrides": {"rope_theta": -Infinity}}}',
    "objective.overrides": '{"objective": {"overrides": {"kl_coef": NaN}}}',
    "task.params ": '{"task": {"name": "m:f", "params": {"deep": ' + '{"a": ' * 900 + "1" + "}" * 900 + "}}}",
    "task.params  ": '{"task": {"name": "m:f", "params": {"x": [' + "[" * 500 + "]" * 500 + "]}}}",
    "seed": '{"seed": 18446744073709551616}',
    "optim.betas.1": '{"optim": {"betas": [0.5, -3]}}',
    "task.params   ": '{"task": {"name": "code", "params": {"memory_mb": 1000000000, "timeout_s": 1e9}}}',
    "task.params    ": '{"task": {"name": "arithmetic", "params": {"max_operand": 9, "colour": "red"}}}',
    "model": '{"model": {"source": "random", "config_overrides": {"hidden_size": 100000000}}}',
    "model ": '{"model": {"source": "random", "config_overrides": {"num_hidden_layers": 2, "hidden_size": 48}}}',
    "task.params     ": '{"task": {"name": "reasoning_gym:basic_arithmetic", "params": {"min_terms": 9, '
    '"max_terms": 2}}}',
}


@pytest.mark.parametrize("field", list(BAD_BODIES))
def test_bad_numbers_and_shapes_are_422_naming_the_field_on_dry_run_and_submit_alike(http, api_server, field):
    body = BAD_BODIES[field]
    dry, real = post_raw(http, api_server.acme, body, dry_run=True), post_raw(http, api_server.acme, body)
    assert (dry.status_code, real.status_code) == (422, 422), (dry.text[:300], real.text[:300])
    assert dry.json() == real.json()
    assert field.strip() in [d["field"] for d in real.json()["detail"]], real.text[:400]


def test_a_body_nested_beyond_the_json_parser_is_a_4xx(http, api_server):
    body = '{"task": {"name": "m:f", "params": {"x": ' + "[" * 200_000 + "]" * 200_000 + "}}}"
    r = post_raw(http, api_server.acme, body)
    assert r.status_code == 400 and "nested too deeply" in r.json()["message"], r.text[:300]


# A spec mutated at any path with any JSON value: the schema either refuses it (SpecError) or accepts a
# spec whose every number is finite, that survives a JSON round trip unchanged, that the policy judges
# without crashing, and whose built-in task params build the task.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
SPEC_PATHS = [
    ("seed",),
    ("steps",),
    ("group_size",),
    ("optim", "lr"),
    ("optim", "betas"),
    ("optim", "grad_clip"),
    ("resources", "cpus_per_learner"),
    ("resources", "threads_per_actor"),
    ("sampling", "temperature"),
    ("task", "params"),
    ("task", "params", "max_operand"),
    ("task", "params", "ops"),
    ("task", "params", "template"),
    ("model", "config_overrides"),
    ("objective", "overrides"),
    ("objective", "overrides", "clip_high"),
    ("checkpoint", "keep_last"),
    ("name",),
]
TASKS = st.sampled_from(
    [
        {"name": "arithmetic"},
        {"name": "code"},
        {"name": "reasoning_gym:basic_arithmetic"},
        {"name": "arithmetic", "params": {"max_operand": 5}},
        {"name": "mod:factory"},
    ]
)


def _finite(v) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    if isinstance(v, list | tuple):
        return all(_finite(x) for x in v)
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(task=TASKS, path=st.sampled_from(SPEC_PATHS), value=JSON_VALUES, admin=st.booleans())
def test_any_mutated_spec_is_refused_cleanly_or_accepted_whole(task, path, value, admin):
    data: dict = {"task": json.loads(json.dumps(task))}
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            return
    node[path[-1]] = value
    try:
        spec = JobSpec.parse(data)
    except SpecError:
        return
    dumped = spec.to_dict()
    assert _finite(dumped)
    assert JobSpec.parse(json.loads(json.dumps(dumped, allow_nan=False))).to_dict() == dumped
    try:
        check_spec(spec, ControlSettings(), admin)
    except PolicyError as e:
        assert e.violations and all(v.field and v.msg for v in e.violations)
    if params_model(spec.task.name) is not None and spec.task.name != "humaneval":
        load_task(spec.task.name, spec.task.params, spec.seed, frozenset(PRIVILEGES))


# -- the IBPO revision template: literal slots, never str.format -----------------------------------------
@pytest.mark.parametrize(
    "template",
    [
        "{prompt:>2000000000} {response} {references}",  # a 2 GB string for every revision
        "{prompt:{response}} {response} {references}",  # the width chosen by the model's own output
        "{prompt!r} {response} {references}",
    ],
)
def test_a_revision_template_with_format_specs_is_refused_naming_the_field(http, api_server, template):
    body = json.dumps({"ibpo": {"revision_template": template}})
    dry, real = post_raw(http, api_server.acme, body, dry_run=True), post_raw(http, api_server.acme, body)
    assert (dry.status_code, real.status_code) == (422, 422), real.text[:300]
    assert [d["field"] for d in real.json()["detail"]] == ["ibpo.revision_template"], real.text[:300]
    assert "braces may only enclose a slot" in real.json()["detail"][0]["msg"]


# -- eval.dataset: as bounded as task.params ------------------------------------------------------------
def test_eval_dataset_cannot_carry_a_megabyte_into_every_stored_spec(http, api_server):
    ev = {"dataset": {"hub_id": "o/n", "metadata_columns": ["c" * 12_000] * 60}}  # ~720 KB, 60 names
    r = post_raw(http, api_server.acme, json.dumps({"eval": ev}), dry_run=True)
    assert r.status_code == 422, r.text[:300]
    assert {d["field"] for d in r.json()["detail"]} == {
        f"eval.dataset.metadata_columns.{i}" for i in range(60)
    }


def test_eval_dataset_is_under_the_free_form_size_cap_like_task_params():
    settings_ = ControlSettings(max_free_form_bytes=1024)
    for spec in (
        JobSpec.parse({"eval": {"dataset": {"hub_id": "o/n", "system_prompt": "s" * 2000}}}),
        JobSpec.parse(
            {"task": {"name": "dataset", "params": {"hub_id": "o/n", "system_prompt": "s" * 2000}}}
        ),
    ):
        with pytest.raises(PolicyError) as e:
            check_spec(spec, settings_, is_admin=True)
        assert [(v.field, "at most 1024" in v.msg) for v in e.value.violations] == [
            ("eval.dataset" if spec.eval else "task.params", True)
        ]
    check_spec(JobSpec.parse({"eval": {"dataset": {"hub_id": "o/n"}}}), settings_, is_admin=True)


# -- 6. /metrics --------------------------------------------------------------------------------------
def test_metrics_need_the_metrics_token_or_an_admin(http, api_server):
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers=auth(api_server.acme)).status_code == 401
    assert http.get("/metrics", headers=auth("not-the-metrics-token-at-all")).status_code == 401
    r = http.get("/metrics", headers=auth(api_server.admin))
    assert r.status_code == 200 and "tgc_jobs" in r.text


def test_prometheus_reads_metrics_with_its_own_token(tmp_path):
    from tgc_rl.control.local import LocalControlPlane

    token = "prometheus-scrape-token-0123456789"
    cp = LocalControlPlane(tmp_path, ray_address="none", env={"TGC_METRICS_TOKEN": token})
    acme = cp.create_token("acme")
    with cp, httpx.Client(base_url=cp.url, timeout=30) as http:
        assert http.get("/metrics", headers=auth(token)).status_code == 200
        assert http.get("/metrics", headers=auth(token[:-1])).status_code == 401
        assert http.get("/v1/jobs", headers=auth(token)).status_code == 401  # it reads metrics, nothing else
        assert http.get("/metrics", headers=auth(acme)).status_code == 401


def test_request_metric_labels_are_bounded_whatever_the_client_sends(http, api_server):
    # methods the HTTP parser knows (it refuses unknown tokens before the app) that the API does not serve
    for i, method in enumerate(["PROPFIND", "SEARCH", "MKCOL", "LOCK", "PURGE", "REPORT", "TRACE", "LINK"]):
        assert http.request(method, "/v1/jobs", headers=auth(api_server.acme)).status_code == 405
        http.get(f"/no/such/path/{i}", headers=auth(api_server.acme))
    r = http.request("OPTIONS", "/v1/datasets/ds_0", headers=auth(api_server.acme))
    assert r.status_code == 405
    text = http.get("/metrics", headers=auth(api_server.admin)).text
    series = [ln for ln in text.splitlines() if ln.startswith("tgc_http_request_duration_seconds_count")]
    methods = {ln.split('method="')[1].split('"')[0] for ln in series}
    routes = {ln.split('route="')[1].split('"')[0] for ln in series}
    assert "other" in methods and methods <= {
        "GET",
        "HEAD",
        "POST",
        "PUT",
        "PATCH",
        "DELETE",
        "OPTIONS",
        "other",
    }
    assert "unmatched" in routes and not any("/no/such" in r for r in routes), routes
    assert "/v1/datasets/{dataset_id}" in routes  # a path matched but not its method: the route's template


# -- 9. names with a trailing newline ------------------------------------------------------------------
@pytest.mark.parametrize("tenant", ["evil\n", "evil\r", "Evil", "", "-x", "a" * 65, "é"])
def test_bad_tenant_names_are_refused(store, tenant):
    with pytest.raises(ValueError, match="not a valid tenant name"):
        TokenStore(store.engine).create(tenant)


@pytest.mark.parametrize("value", ["os:system\n", "os:system\r\n", "mod:f\n#", "reasoning_gym:x\n"])
def test_entry_points_with_a_trailing_newline_are_not_names(value):
    with pytest.raises(SpecError):
        JobSpec.parse({"task": {"name": value}})


def test_custom_resources_that_choose_nodes_are_the_operators_to_give(monkeypatch):
    spec = JobSpec.parse(
        {
            "resources": {
                "learner_custom_resources": {"team_b_gpu": 1},
                "rollout_custom_resources": {"spot": 0.5},
            }
        }
    )
    with pytest.raises(PolicyError) as e:
        check_spec(spec, ControlSettings(), is_admin=False)
    assert {v.field for v in e.value.violations} == {
        "resources.learner_custom_resources",
        "resources.rollout_custom_resources",
    }
    with pytest.raises(PolicyError) as e:
        check_spec(spec, ControlSettings(allowed_custom_resources=["spot"]), is_admin=False)
    assert [v.field for v in e.value.violations] == ["resources.learner_custom_resources"]
    check_spec(spec, ControlSettings(allowed_custom_resources=["spot", "team_b_gpu"]), is_admin=False)
    check_spec(spec, ControlSettings(), is_admin=True)
    monkeypatch.setenv("TGC_ALLOWED_CUSTOM_RESOURCES", '["spot", "team_b_gpu"]')
    check_spec(spec, ControlSettings.from_env(), is_admin=False)
