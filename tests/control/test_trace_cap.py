"""The operator's cap on rollout-trace bytes per job (setting max_trace_bytes, env TGC_MAX_TRACE_BYTES): a spec
whose traces.max_total_bytes exceeds it is refused at submission, naming the field and the cap."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from tests.servers import auth
from tgc_rl.control.local import LocalControlPlane
from tgc_rl.control.settings import ControlSettings

CAP = 16 << 20
# one trace file (steps_per_file x max_step_bytes = 50 x 256 KiB) fits the cap, so only the cap decides
TINY = {"name": "tiny", "steps": 3, "group_size": 2, "prompts_per_step": 2}


def _traces(total: int) -> dict:
    return {**TINY, "traces": {"max_total_bytes": total}}


def test_the_cap_defaults_to_the_schemas_bound_and_cannot_exceed_it():
    assert ControlSettings().max_trace_bytes == 1 << 30  # default behaviour: what the schema allowed before
    with pytest.raises(ValidationError, match="max_trace_bytes"):
        ControlSettings(max_trace_bytes=(1 << 30) + 1)
    with pytest.raises(ValidationError, match="max_trace_bytes"):
        ControlSettings(max_trace_bytes=1024)  # below the schema's least bound no spec could pass


def test_a_spec_above_the_servers_trace_cap_is_422_naming_the_field_and_the_cap(tmp_path):
    cp = LocalControlPlane(tmp_path, ray_address="none", env={"TGC_MAX_TRACE_BYTES": str(CAP)})
    tenant = cp.create_token("acme")
    with cp, httpx.Client(base_url=cp.url, timeout=30, headers=auth(tenant)) as http:
        r = http.post("/v1/jobs", json=_traces(CAP + 1))
        assert r.status_code == 422, r.text
        [detail] = r.json()["detail"]
        assert detail["field"] == "traces.max_total_bytes" and str(CAP) in detail["msg"]
        assert "max_trace_bytes" in detail["msg"]
        # the spec's default (64 MiB) is above this cap too: a tenant must set it, and is told so
        assert http.post("/v1/jobs", json=TINY).json()["detail"][0]["field"] == "traces.max_total_bytes"
        assert http.post("/v1/jobs", json=_traces(CAP)).status_code == 201
