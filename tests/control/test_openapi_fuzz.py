"""Property-based fuzzing of every documented operation (schemathesis) against a real server: the published
schema says what the server does (every check schemathesis has), and nothing answers 5xx.

Operations are fuzzed one after another inside a test (schemathesis' pytest loader for fixtures does
not work with this pytest version), each with its own bounded Hypothesis run of schema-valid and
schema-invalid requests.
"""

from __future__ import annotations

import json

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.servers import auth

# A request valid by the schema may still be refused with the operation's documented 422 where JSON Schema
# cannot state the rule: a job spec's cross-field rules and this server's policy (the 422's description
# lists them), an upload's content and file name (what the file holds decides its format and validity).
SEMANTIC_422 = [("POST", "/v1/jobs"), ("POST", "/v1/datasets")]
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429"]  # schemathesis' default, less 5xx


def _config() -> schemathesis.Config:
    operations = [
        {
            "include-method": method,
            "include-path": path,
            "checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "422"]}},
        }
        for method, path in SEMANTIC_422
    ]
    return schemathesis.Config.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}}, "operations": operations}
    )


def _operations(api_server):
    schema = schemathesis.openapi.from_url(f"{api_server.url}/openapi.json", config=_config())
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) >= 12  # every route is documented
    return ops


def _cases(operation):
    """Schema-valid and, where the operation has an input to break, schema-invalid requests."""
    strategies = [operation.as_strategy()]
    if operation.query or operation.headers or operation.path_parameters or operation.body:
        strategies.append(operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    return st.one_of(strategies)


def _fuzz(operation, check, max_examples: int) -> None:
    @given(case=_cases(operation))
    @settings(
        max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def run(case) -> None:
        check(case)

    run()


def test_every_generated_request_gets_what_the_schema_documents(api_server):
    """All of schemathesis' checks: no 5xx, only documented status codes, content types and headers,
    response bodies that match their schema, schema-invalid requests refused, schema-valid ones accepted."""

    def check(case) -> None:
        case.call_and_validate(
            base_url=api_server.url, headers={"Authorization": f"Bearer {api_server.acme}"}, timeout=30
        )

    for op in _operations(api_server):
        _fuzz(op, check, max_examples=12)


def test_no_generated_request_without_a_token_gets_past_auth(api_server):
    def check(case) -> None:
        r = case.call(base_url=api_server.url, timeout=30)
        assert r.status_code < 500, f"{case.method} {case.formatted_path}: {r.status_code} {r.text[:500]}"
        if case.path.startswith("/v1/") and case.path != "/v1/schema":
            # 400/422: a body that is not JSON, or not the operation's shape, is refused before any token is read
            assert r.status_code in (400, 401, 404, 405, 413, 422), (
                f"{case.method} {case.formatted_path}: {r.status_code}"
            )

    for op in _operations(api_server):
        _fuzz(op, check, max_examples=5)


def test_allow_names_every_method_of_the_path(api_server):
    """A method a path lacks is a 405 whose Allow lists every documented method of that path (a path served
    by one route per method, such as a dataset's GET and DELETE, included)."""
    doc = httpx.get(f"{api_server.url}/openapi.json").json()
    with httpx.Client(base_url=api_server.url, headers=auth(api_server.acme), timeout=30) as http:
        for path, item in doc["paths"].items():
            documented = {m.upper() for m in item if m != "parameters"}
            url = path.replace("{job_id}", "job_0").replace("{dataset_id}", "ds_0")
            for method in ("OPTIONS", "PUT", "PATCH"):
                if method in documented:
                    continue
                r = http.request(method, url)
                assert r.status_code == 405, (method, path, r.status_code)
                allowed = {m.strip() for m in r.headers["Allow"].split(",")}
                assert allowed - {"HEAD"} == documented, (method, path, r.headers["Allow"])
                assert r.json()["error"] == "method_not_allowed"


def test_the_document_states_the_app_wide_answers(api_server):
    """What no one route's signature says: every operation's 422 is the ErrorBody shape (unknown query
    parameters included), JSON bodies may be a 400, a token's operations may be a 429 with Retry-After, and no
    query or header parameter offers a null the wire cannot carry."""
    doc = httpx.get(f"{api_server.url}/openapi.json").json()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            where, responses = f"{method.upper()} {path}", op["responses"]
            assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody"), (
                where
            )
            if "application/json" in op.get("requestBody", {}).get("content", {}):
                assert "400" in responses, where
            if path.startswith(("/v1/jobs", "/v1/datasets")):
                assert "Retry-After" in responses["429"]["headers"], where
            for param in op.get("parameters", []):
                assert "null" not in json.dumps(param["schema"]), (where, param["name"])
