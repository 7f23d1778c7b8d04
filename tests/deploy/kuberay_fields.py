"""Checks a KubeRay ray.io/v1 object field by field against `kuberay_v1_fields.yaml`; the Kubernetes core
types inside it (pod templates, services, env vars, ...) go to kubernetes-validate in strict mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

FIELDS = yaml.safe_load((Path(__file__).with_name("kuberay_v1_fields.yaml")).read_text())
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

# Each core type, wrapped into the smallest core object that holds it, so kubernetes-validate checks it.
_CONTAINER = {"name": "c", "image": "i"}
_WRAP = {
    "PodTemplateSpec": lambda v: {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t"},
        "template": v,
    },
    "Service": lambda v: {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, **v},
    "ObjectMeta": lambda v: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m", **v}},
    "ResourceRequirements": lambda v: _pod({**_CONTAINER, "resources": v}),
    "SecurityContext": lambda v: _pod({**_CONTAINER, "securityContext": v}),
    "EnvVar": lambda v: _pod({**_CONTAINER, "env": [v]}),
    "EnvFromSource": lambda v: _pod({**_CONTAINER, "envFrom": [v]}),
    "VolumeMount": lambda v: _pod({**_CONTAINER, "volumeMounts": [v]}),
    "EnvVarSource": lambda v: _pod({**_CONTAINER, "env": [{"name": "e", "valueFrom": v}]}),
}


def _pod(container: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [container]}}


def validate_core(obj: dict) -> list[str]:
    """kubernetes-validate --strict against the oldest supported and the newest Kubernetes."""
    problems = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            problems.append(
                f"{obj.get('kind')} {obj.get('metadata', {}).get('name')} (Kubernetes {version}): "
                f"{where}: {e.message}"
            )
    return problems


def check(value: Any, type_name: str, path: str) -> list[str]:
    """Every problem of `value` read as `type_name`, each naming its path."""
    if type_name.startswith("[") and type_name.endswith("]"):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [p for i, item in enumerate(value) for p in check(item, type_name[1:-1], f"{path}[{i}]")]
    if type_name == "scalar":
        return [] if isinstance(value, str | int | float | bool) else [f"{path}: expected a scalar"]
    if type_name == "map":
        if not isinstance(value, dict) or not all(
            isinstance(v, str | int | float | bool) for v in value.values()
        ):
            return [f"{path}: expected a map of scalars"]
        return []
    if type_name.startswith("core:"):
        return [f"{path}: {p}" for p in validate_core(_WRAP[type_name[5:]](value))]
    fields = FIELDS["types"][type_name]
    if not isinstance(value, dict):
        return [f"{path}: expected an object ({type_name})"]
    problems = []
    for key, sub in value.items():
        if key not in fields:
            problems.append(f"{path}.{key}: not a field of KubeRay's {type_name}")
            continue
        allowed = FIELDS["enums"].get(f"{type_name}.{key}")
        if allowed is not None and sub not in allowed:
            problems.append(f"{path}.{key}: {sub!r} is not one of {allowed}")
        problems += check(sub, fields[key], f"{path}.{key}")
    return problems


def check_kuberay(obj: dict) -> list[str]:
    """Problems of one rendered RayCluster or RayJob (empty: every field is KubeRay's)."""
    if obj.get("apiVersion") != "ray.io/v1":
        return [f"{obj.get('kind')}: apiVersion {obj.get('apiVersion')!r} is not ray.io/v1"]
    return check(obj, obj["kind"], obj["kind"])
