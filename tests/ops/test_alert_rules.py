"""The alerting rules as shipped: one file (helm/tgc-rl/alerts/tgc-rl.rules.yaml) that promtool accepts and
whose unit tests (alert_rules_test.yaml: each alert fires on the series it is for and stays quiet on its
look-alikes) pass, rendered by the chart into a PrometheusRule and loaded by the compose stack's Prometheus.
A real Prometheus evaluating them against a running job is test_observability's."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import rlcore
from tests.deploy.test_chart import render
from tests.ops.exported import unexported
from tgc_rl.run_layout import D2_RESIDUAL

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RULES = ROOT / "helm" / "tgc-rl" / "alerts" / "tgc-rl.rules.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool comes with Debian's prometheus package"
)


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _promtool(*args: str) -> str:
    out = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=HERE)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@needs_promtool
def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    assert f"SUCCESS: {len(rules())} rules found" in _promtool("check", "rules", str(RULES))
    _promtool("test", "rules", "alert_rules_test.yaml")


@needs_promtool
def test_the_unit_tests_can_fail(tmp_path):
    """A rule whose threshold moved makes the unit tests fail: they pin behaviour, not just syntax."""
    loosened = RULES.read_text().replace(
        f'{{metric="{D2_RESIDUAL}"}} > 1e-4', f'{{metric="{D2_RESIDUAL}"}} > 1'
    )
    assert loosened != RULES.read_text()
    (tmp_path / "rules.yaml").write_text(loosened)
    test = yaml.safe_load((HERE / "alert_rules_test.yaml").read_text())
    test["rule_files"] = [str(tmp_path / "rules.yaml")]
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    out = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "test.yaml")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0 and "TgcCancellationBroken" in out.stdout + out.stderr


def test_every_alert_is_tested_and_reads_only_what_the_code_exports():
    tested = {
        case["alertname"]
        for test in yaml.safe_load((HERE / "alert_rules_test.yaml").read_text())["tests"]
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    for rule in rules():
        assert rule["alert"] in tested, f"{rule['alert']} never fires in alert_rules_test.yaml"
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert {"summary", "description"} <= rule["annotations"].keys()
        assert unexported(rule["expr"]) == [], rule["alert"]


def test_the_cancellation_alert_reads_d2_against_the_trainers_tolerance():
    (rule,) = [r for r in rules() if r["alert"] == "TgcCancellationBroken"]
    threshold = re.search(rf'\{{metric="{re.escape(D2_RESIDUAL)}"\}} > ([0-9.e-]+)', rule["expr"])
    assert (
        threshold and float(threshold[1]) == rlcore.RESIDUAL_TOLERANCE
    )  # the trainer warns at the same level


def test_chart_ships_the_rules_as_a_prometheusrule():
    found = [
        d
        for d in render({"metrics": {"prometheusRule": {"labels": {"release": "kps"}}}})
        if d["kind"] == "PrometheusRule"
    ]
    assert len(found) == 1
    rule = found[0]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())  # Prometheus' own {{ $labels }} left as written
    off = render({"metrics": {"prometheusRule": {"enabled": False}}})
    assert not [d for d in off if d["kind"] == "PrometheusRule"]


def test_compose_prometheus_loads_the_same_rules():
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yaml").read_text())
    mounts = {
        m.split(":")[1]: (ROOT / "deploy" / m.split(":")[0]).resolve()
        for m in compose["services"]["prometheus"]["volumes"]
        if m.startswith(".")
    }
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (pattern,) = config["rule_files"]
    directory, glob = pattern.rsplit("/", 1)
    assert list(mounts[directory].glob(glob)) == [RULES]
