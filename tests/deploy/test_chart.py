"""The Helm chart, rendered by Helm's own engine (helm-python-sdk embeds Helm v4): strict lint, every
variant rendered, every core object validated by kubernetes-validate --strict, every field set on a
KubeRay object checked against KubeRay's ray.io/v1 API (`kuberay_v1_fields.yaml`)."""

from __future__ import annotations

import copy
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from tests.deploy.kuberay_fields import check_kuberay, validate_core
from tgc_rl.config import JobSpec
from tgc_rl.control.settings import ControlSettings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tgc-rl"
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
NOT_CORE = ("ray.io/", "monitoring.coreos.com/")
HELM_WARNING = 2  # Helm's lint severities: 1 info, 2 warning, 3 error


def _tiny_job() -> dict:
    spec = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    spec.pop("name")
    return {"name": "tiny", "spec": spec}


def _gpu_groups() -> list[dict]:
    groups = copy.deepcopy(DEFAULTS["rayCluster"]["workerGroups"])
    for g in groups:
        if g["name"] == "gpu":
            g.update(enabled=True, replicas=1, image="registry.example/tgc-rl:0.1.0-cuda")
    return groups


VARIANTS: dict[str, dict] = {
    "default": {},
    "rayjob": {"mode": "rayjob", "rayJob": {"jobs": [_tiny_job()], "submissionMode": "K8sJobMode"}},
    "rayjob-http": {
        "mode": "rayjob",
        "rayJob": {"jobs": [_tiny_job()], "submissionMode": "HTTPMode"},
        "rayCluster": {"auth": {"enabled": False}},
    },
    "gpu": {"rayCluster": {"workerGroups": _gpu_groups()}},
    "postgresql": {
        "controlPlane": {
            "replicas": 2,
            "database": {"existingSecret": "tgc-db"},
            "persistence": {"enabled": False},
        }
    },
    # a cluster without the Prometheus operator's CRDs
    "monitoring-off": {
        "metrics": {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}}
    },
    "grafana-dashboard-off": {"metrics": {"grafanaDashboard": {"enabled": False}}},
    "sandbox-off": {"sandbox": {"enabled": False}},
    "no-autoscaling": {
        "rayCluster": {"enableInTreeAutoscaling": False},
        "podDisruptionBudget": {"enabled": False},
    },
}


def render(values: dict) -> list[dict]:
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name="tgc", namespace="ml", is_install=True)
    docs = []
    for name, text in sorted(manifests.items()):
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request) -> tuple[str, list[dict]]:
    return request.param, render(VARIANTS[request.param])


def _one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, [d["metadata"]["name"] for d in found]
    return found[0]


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def _worker_pods(docs: list[dict]) -> list[dict]:
    specs = [d["spec"] for d in docs if d["kind"] == "RayCluster"]
    specs += [d["spec"]["rayClusterSpec"] for d in docs if d["kind"] == "RayJob"]
    return [g["template"]["spec"] for s in specs for g in s["workerGroupSpecs"]]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_chart_lints_strictly(name):
    result = helm.lint(str(CHART), VARIANTS[name], strict=True, namespace="ml")
    assert not result["errors"], result
    assert [m for m in result["messages"] if m["severity"] >= HELM_WARNING] == [], result


def test_every_core_object_is_valid_kubernetes(variant):
    _, docs = variant
    problems = [p for d in docs if not d["apiVersion"].startswith(NOT_CORE) for p in validate_core(d)]
    assert problems == []


def test_every_kuberay_field_is_in_the_ray_io_v1_api(variant):
    name, docs = variant
    kuberay = [d for d in docs if d["apiVersion"].startswith("ray.io/")]
    assert kuberay, f"{name}: no KubeRay object rendered"
    assert [p for d in kuberay for p in check_kuberay(d)] == []


def test_a_misspelt_kuberay_field_fails_the_check():
    cluster = _one(render({}), "RayCluster")
    group = cluster["spec"]["workerGroupSpecs"][0]
    group["rayStartParamz"] = group.pop("rayStartParams")
    assert check_kuberay(cluster) == [
        "RayCluster.spec.workerGroupSpecs[0].rayStartParamz: not a field of KubeRay's WorkerGroupSpec"
    ]


def test_a_misspelt_field_inside_a_pod_template_fails_the_check():
    cluster = _one(render({}), "RayCluster")
    container = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    container["securityContext"]["procMountt"] = container["securityContext"].pop("procMount")
    problems = check_kuberay(cluster)
    assert problems and all("procMountt" in p for p in problems), problems


def test_a_bad_enum_value_fails_the_check():
    cluster = _one(render({}), "RayCluster")
    cluster["spec"]["autoscalerOptions"]["upscalingMode"] = "Fast"
    assert any("upscalingMode: 'Fast' is not one of" in p for p in check_kuberay(cluster))


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"mode": "rayjobs"}, "mode"),
        ({"rayJob": {"submissionMode": "K8sJob"}}, "submissionMode"),
        ({"controlPlane": {"allowUnsafeSandbox": "yes"}}, "allowUnsafeSandbox"),
        (
            {
                "rayCluster": {
                    "workerGroups": [
                        {"name": "CPU", "replicas": 1, "minReplicas": 0, "maxReplicas": 2, "resources": {}}
                    ]
                }
            },
            "name",
        ),
        ({"controlPlane": {"databse": {}}}, "databse"),
    ],
)
def test_bad_values_fail_with_the_field_named(values, named):
    with pytest.raises(helm.HelmError) as e:
        render(values)
    assert named in str(e.value), str(e.value)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (
            {
                "rayCluster": {
                    "workerGroups": [
                        {
                            "name": "cpu",
                            "enabled": True,
                            "replicas": 5,
                            "minReplicas": 0,
                            "maxReplicas": 4,
                            "resources": {},
                        }
                    ]
                }
            },
            "replicas",
        ),
        ({"controlPlane": {"replicas": 2}}, "PostgreSQL"),
    ],
)
def test_inconsistent_values_fail_at_render(values, says):
    with pytest.raises(helm.HelmError) as e:
        render(values)
    assert says in str(e.value), str(e.value)


def test_settings_passed_to_the_control_plane_exist():
    for _, values in VARIANTS.items():
        cp = _one(render(values), "Deployment", "control-plane")["spec"]["template"]["spec"]["containers"][0]
        names = {n.removeprefix("TGC_").lower() for n in _env(cp) if n.startswith("TGC_")}
        assert names <= set(ControlSettings.model_fields), names - set(ControlSettings.model_fields)


def test_metrics_token_comes_from_a_secret_that_the_service_monitor_sends():
    docs = render({})
    secret = _one(docs, "Secret", "-metrics")
    cp = _one(docs, "Deployment", "control-plane")["spec"]["template"]["spec"]["containers"][0]
    ref = _env(cp)["TGC_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "token"} and "token" in secret["data"]
    endpoint = _one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": ref}


def test_unsafe_sandbox_is_off_unless_the_operator_says_so():
    def flag(values: dict) -> str:
        cp = _one(render(values), "Deployment", "control-plane")["spec"]["template"]["spec"]["containers"][0]
        return _env(cp)["TGC_ALLOW_UNSAFE_SANDBOX"]["value"]

    assert flag({}) == "false"
    assert flag({"controlPlane": {"allowUnsafeSandbox": True}}) == "true"


def test_workers_get_what_bubblewrap_needs_and_nothing_more():
    docs = render({})
    for pod in _worker_pods(docs):
        ctx = pod["containers"][0]["securityContext"]
        assert pod["hostUsers"] is False
        assert ctx["procMount"] == "Unmasked"
        assert ctx["seccompProfile"] == {"type": "Unconfined"} and ctx["appArmorProfile"] == {
            "type": "Unconfined"
        }
        assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
        assert ctx["runAsNonRoot"] is True and "privileged" not in ctx
    for pod in _worker_pods(render(VARIANTS["sandbox-off"])):
        assert "hostUsers" not in pod and "procMount" not in pod["containers"][0]["securityContext"]


def test_sandbox_pods_may_reach_only_the_release_and_dns():
    docs = render({})
    policy = _one(docs, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Egress"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ray-worker"
    workers = [
        g["template"]["metadata"]["labels"] for g in _one(docs, "RayCluster")["spec"]["workerGroupSpecs"]
    ]
    assert all(policy["podSelector"]["matchLabels"].items() <= labels.items() for labels in workers)
    targets = [peer for rule in policy["egress"] for peer in rule["to"]]
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "tgc"}}} in targets
    assert len(policy["egress"]) == 2 and not any("ipBlock" in t for t in targets)


def test_disruption_budgets_cover_the_control_plane_and_the_ray_head():
    docs = render({})
    cp_labels = _one(docs, "Deployment", "control-plane")["spec"]["template"]["metadata"]["labels"]
    head_labels = _one(docs, "RayCluster")["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    selectors = [d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert any(s.items() <= cp_labels.items() for s in selectors)
    assert any(s.items() <= head_labels.items() for s in selectors)


def test_control_plane_is_probed_and_needs_no_kubernetes_api():
    pod = _one(render({}), "Deployment", "control-plane")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert (
        c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    )
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["automountServiceAccountToken"] is False


def test_autoscaler_role_is_bound_to_the_ray_pods_account():
    docs = render({})
    account = _one(docs, "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"]
    binding = _one(docs, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "ml"}]
    rules = _one(docs, "Role")["rules"]
    assert {
        "apiGroups": ["ray.io"],
        "resources": ["rayclusters"],
        "verbs": ["get", "list", "watch", "patch"],
    } in rules
    assert not [d for d in render(VARIANTS["no-autoscaling"]) if d["kind"] in ("Role", "RoleBinding")]


def test_rayjob_mode_runs_each_job_in_its_own_cluster():
    docs = render(VARIANTS["rayjob"])
    assert not [d for d in docs if d["kind"] == "RayCluster"]
    job = _one(docs, "RayJob")["spec"]
    assert job["submissionMode"] == "K8sJobMode" and job["shutdownAfterJobFinishes"] is True
    assert job["activeDeadlineSeconds"] == DEFAULTS["rayJob"]["activeDeadlineSeconds"]
    assert "--spec /etc/tgc-rl/job/spec.yaml" in job["entrypoint"]
    submitter = job["submitterPodTemplate"]["spec"]["containers"][0]
    assert "RAY_AUTH_TOKEN" in _env(submitter)
    spec = JobSpec.model_validate(yaml.safe_load(_one(docs, "ConfigMap", "-job-tiny")["data"]["spec.yaml"]))
    assert spec.name == "tiny" and spec.steps == 3
    cp = _one(docs, "Deployment", "control-plane")["spec"]["template"]["spec"]["containers"][0]
    assert _env(cp)["TGC_RAY_ADDRESS"]["value"] == "none"


def test_cluster_mode_points_the_control_plane_at_the_ray_head():
    docs = render({})
    cp = _one(docs, "Deployment", "control-plane")["spec"]["template"]["spec"]["containers"][0]
    assert _env(cp)["TGC_RAY_ADDRESS"]["value"] == "http://tgc-tgc-rl-ray-head-svc:8265"
    assert "TGC_RAY_AUTH_TOKEN" in _env(cp)


def test_gpu_group_requests_gpus_with_its_own_image_and_bounds():
    cluster = _one(render(VARIANTS["gpu"]), "RayCluster")
    gpu = next(g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu")
    container = gpu["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["image"] == "registry.example/tgc-rl:0.1.0-cuda"
    assert gpu["minReplicas"] <= gpu["replicas"] <= gpu["maxReplicas"]
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu["template"]["spec"]["tolerations"])
    assert {g["groupName"] for g in _one(render({}), "RayCluster")["spec"]["workerGroupSpecs"]} == {"cpu"}


def test_postgresql_url_comes_from_the_named_secret():
    docs = render(VARIANTS["postgresql"])
    cp = _one(docs, "Deployment", "control-plane")["spec"]["template"]["spec"]["containers"][0]
    assert _env(cp)["TGC_DB_URL"]["valueFrom"]["secretKeyRef"] == {"name": "tgc-db", "key": "url"}
    assert not [
        d for d in docs if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"].endswith("-data")
    ]


def test_monitoring_off_renders_no_prometheus_objects():
    docs = render(VARIANTS["monitoring-off"])
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert [d for d in render({}) if d["kind"] == "PodMonitor"]


def test_the_charts_limits_are_the_servers_defaults_and_reach_it():
    """controlPlane.limits / .retention: each value reaches its setting, and the chart's defaults are the server's."""
    cp = _one(render({}), "Deployment", "control-plane")["spec"]["template"]["spec"]["containers"][0]
    env = {name: e["value"] for name, e in _env(cp).items() if "value" in e}
    settings = ControlSettings()
    limit_vars = [n for n in env if n.removeprefix("TGC_").lower() in LIMIT_SETTINGS]
    assert sorted(limit_vars) == sorted(f"TGC_{s.upper()}" for s in LIMIT_SETTINGS)
    for name in limit_vars:
        field = name.removeprefix("TGC_").lower()
        assert float(env[name]) == float(getattr(settings, field)), name
    changed = render(
        {"controlPlane": {"limits": {"maxQueuedJobs": 7}, "retention": {"maxAgeSeconds": 86400}}}
    )
    cp = _one(changed, "Deployment", "control-plane")["spec"]["template"]["spec"]["containers"][0]
    assert _env(cp)["TGC_MAX_QUEUED_JOBS"]["value"] == "7"
    assert _env(cp)["TGC_JOB_RETENTION_S"]["value"] == "86400"


LIMIT_SETTINGS = (
    "max_queued_jobs",
    "rate_limit_per_s",
    "rate_limit_burst",
    "max_streams_per_tenant",
    "stream_max_s",
    "stream_reauth_s",
    "keep_alive_s",
    "client_header_timeout_s",
    "client_body_timeout_s",
    "job_retention_s",
    "max_ended_jobs_per_tenant",
    "retention_sweep_s",
    "max_trace_bytes",
)
