"""The Grafana dashboard as shipped: one JSON file, rendered into the chart's ConfigMap and mounted by the
compose stack beside a Prometheus whose configuration Prometheus' own promtool accepts. That every query
returns data is test_observability's job."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_chart import render
from tests.ops.exported import unexported
from tgc_rl import run_layout as rl

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "helm" / "tgc-rl" / "dashboards" / "tgc-rl.json"
COMPOSE = ROOT / "deploy" / "docker-compose.yaml"
# What the issue asks to see, and a metric each panel must draw on for it.
WANTED = {
    "jobs by state": "tgc_jobs",
    "reward": rl.REWARD_MEAN,
    "accuracy": rl.REWARD_ACCURACY,
    "D1": rl.D1_GCPR,
    "D2": rl.D2_RESIDUAL,
    "entropy": rl.ENTROPY,
    "tokens/s": rl.THROUGHPUT_TOKENS_PER_S,
    "step phases": rl.TIMING_TRAIN,
    "verifier timeouts": rl.REWARD_TIMEOUTS,
    "verifier errors": rl.REWARD_ERRORS,
    "weight sync": rl.TIMING_SYNC,
    "sandbox runs": "tgc_sandbox_runs_total",
    "off-policy mismatch": rl.MISMATCH_K3,
    "behaviour correction": rl.BEHAVIOUR_CORRECTED_FRAC,
    "shared-token spread": rl.MISMATCH_SPREAD_MAX,
    "correction weight": rl.BEHAVIOUR_COEF_MEAN,
    "shared pairs": rl.MISMATCH_SHARED_PAIRS,
    "stale drops": rl.ROLLOUT_STALE_DROPPED,
}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs(dash: dict) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_dashboard_covers_what_an_operator_watches():
    dash = _dashboard()
    exprs = " ".join(_exprs(dash))
    assert {k: m for k, m in WANTED.items() if m not in exprs} == {}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "tgc-rl"
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
    variables = {v["name"] for v in dash["templating"]["list"]}
    used = set(re.findall(r"\$(\w+)", " ".join(_exprs(dash)))) - {"__rate_interval"}
    assert used <= variables, used - variables


def test_metric_names_are_ones_the_code_exports():
    """Every tgc_ metric and per-step metric a query reads is defined in the code."""
    assert {expr: missing for expr in _exprs(_dashboard()) if (missing := unexported(expr))} == {}


def test_chart_ships_the_dashboard_as_a_configmap():
    docs = render({})
    found = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("grafana-dashboard")
    ]
    assert len(found) == 1
    cm = found[0]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for
    assert json.loads(cm["data"]["tgc-rl.json"]) == _dashboard()
    off = render({"metrics": {"grafanaDashboard": {"enabled": False}}})
    assert not [d for d in off if d["kind"] == "ConfigMap" and "grafana" in d["metadata"]["name"]]


def test_compose_stack_runs_prometheus_and_grafana_with_the_dashboard():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    grafana, prom = services["grafana"], services["prometheus"]
    mounts = {
        m.split(":")[1]: (COMPOSE.parent / m.split(":")[0]).resolve()
        for m in grafana["volumes"]
        if m.startswith(".")
    }
    assert mounts["/etc/grafana/dashboards"] == DASHBOARD.parent
    provisioning = mounts["/etc/grafana/provisioning"]
    provider = yaml.safe_load((provisioning / "dashboards" / "tgc-rl.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"][0]
    assert source["type"] == "prometheus" and source["url"].endswith(":9090")
    assert prom["network_mode"] == "service:control-plane"  # the managed Ray head listens on its loopback
    assert "127.0.0.1:9090:9090" in services["control-plane"]["ports"]
    assert "TGC_METRICS_TOKEN" in services["control-plane"]["environment"]
    assert compose["secrets"]["metrics_token"] == {"environment": "TGC_METRICS_TOKEN"}


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool comes with Debian's prometheus package"
)
def test_compose_prometheus_config_is_valid(tmp_path):
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["tgc-control-plane"]["authorization"]["credentials_file"] == "/run/secrets/metrics_token"
    assert jobs["ray"]["http_sd_configs"][0]["url"].endswith("/api/prometheus/sd")
    # promtool opens the credential files: point them at stand-ins here
    for job in jobs.values():
        for auth in [
            job.get("authorization"),
            *[sd.get("authorization") for sd in job.get("http_sd_configs", [])],
        ]:
            if auth:
                stand_in = tmp_path / Path(auth["credentials_file"]).name
                stand_in.write_text("x" * 32)
                auth["credentials_file"] = str(stand_in)
    # and the rule files at the path compose mounts them from
    config["rule_files"] = [
        str(ROOT / "helm" / "tgc-rl" / "alerts" / Path(p).name) for p in config["rule_files"]
    ]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    out = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout
