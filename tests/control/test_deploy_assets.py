"""The deployment files, checked without a cluster: the Helm chart's YAML and the references of its
templates, the Dockerfile, the compose file and the example job specs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from services.config import JobSpec

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tgc-rl"
TEMPLATES = sorted((CHART / "templates").glob("*"))


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def test_chart_metadata_is_a_helm_v2_application_chart():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "tgc-rl" and chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])


def _lookup(values: dict, dotted: str):
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def test_every_values_reference_in_the_templates_exists_in_values_yaml(values):
    missing = []
    for path in TEMPLATES:
        for ref in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", path.read_text()):
            try:
                _lookup(values, ref.rstrip("."))
            except KeyError:
                missing.append(f"{path.name}: .Values.{ref}")
    assert not missing


def test_every_included_template_is_defined():
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    defined = set(re.findall(r'define "([^"]+)"', helpers))
    used = {name for p in TEMPLATES for name in re.findall(r'include "([^"]+)"', p.read_text())}
    assert used <= defined, used - defined


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_actions_are_balanced(path):
    text = path.read_text()
    assert text.count("{{") == text.count("}}")
    opened = len(re.findall(r"\{\{-?\s*(if|range|with|define)\b", text))
    closed = len(re.findall(r"\{\{-?\s*end\b", text))
    assert opened == closed, f"{path.name}: {opened} blocks opened, {closed} closed"


def test_values_define_cpu_and_gpu_worker_groups(values):
    groups = {g["name"]: g for g in values["rayCluster"]["workerGroups"]}
    assert {"cpu", "gpu"} <= set(groups)
    gpu = groups["gpu"]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu["tolerations"])
    for g in groups.values():
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]


def test_chart_deploys_control_plane_raycluster_and_service_monitor():
    kinds = {k for p in TEMPLATES for k in re.findall(r"^kind: (\w+)", p.read_text(), re.M)}
    assert {"Deployment", "Service", "RayCluster", "ServiceMonitor", "PersistentVolumeClaim"} <= kinds
    raycluster = (CHART / "templates" / "raycluster.yaml").read_text()
    assert "apiVersion: ray.io/v1" in raycluster and "workerGroupSpecs" in raycluster


def test_control_plane_is_probed_on_healthz_and_readyz():
    text = (CHART / "templates" / "control-plane.yaml").read_text()
    assert "path: /healthz" in text and "path: /readyz" in text


def test_settings_named_in_the_chart_exist():
    from services.control.settings import ControlSettings

    text = (CHART / "templates" / "control-plane.yaml").read_text()
    names = {n.lower() for n in re.findall(r"name: TGC_([A-Z_]+)", text)}
    assert names <= set(ControlSettings.model_fields), names - set(ControlSettings.model_fields)


def test_dockerfile_installs_bubblewrap_and_runs_the_control_plane():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert re.search(r"apt-get install .*bubblewrap", text)
    assert "bwrap --version" in text
    assert 'CMD ["tgc", "serve"' in text


def test_compose_file_builds_the_image_and_uses_postgres():
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yaml").read_text())
    cp = compose["services"]["control-plane"]
    assert cp["build"]["dockerfile"] == "docker/Dockerfile"
    assert cp["environment"]["TGC_DB_URL"].startswith("postgresql+psycopg://")


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_job_specs_are_valid(path):
    assert JobSpec.from_yaml(path).name == path.stem
