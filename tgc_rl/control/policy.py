"""Server-side admission rules for a job spec, beyond what the schema itself enforces.

The schema (tgc_rl.config) bounds each value; the operator may bound them tighter here, and a
shared service must also bound the free-form mappings and decide who may use which privilege: run
their own code, read host paths, or run model-written code without the sandbox (docs/security.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from tgc_rl.config import BUILTIN_MODEL_SOURCES, JobSpec
from tgc_rl.control.settings import ControlSettings
from tgc_rl.tasks.dataset import DatasetParams
from tgc_rl.tasks.grants import (
    CUSTOM_CODE,
    HOST_PATHS,
    PRIVILEGES,
    UNSAFE_SANDBOX,
    encode_grants,
    missing_grants,
)


@dataclass(frozen=True)
class Violation:
    field: str
    msg: str


class PolicyError(ValueError):
    def __init__(self, violations: list[Violation]):
        self.violations = violations
        super().__init__("; ".join(f"{v.field}: {v.msg}" for v in violations))


_HOW_TO_GRANT = {
    CUSTOM_CODE: "custom code (`module:function`) needs an admin token or the server setting allow_custom_code",
    HOST_PATHS: "paths on the workers' hosts need an admin token or the server setting allow_custom_code; use "
    f"one of {', '.join(sorted(BUILTIN_MODEL_SOURCES))} for model.source, and an uploaded dataset (dataset_id) "
    "or a file under the server's data root (file) for data",
    UNSAFE_SANDBOX: "running model-written code without the sandbox is the operator's decision: it needs an "
    "admin token or the server setting allow_unsafe_sandbox",
}


def caller_grants(settings: ControlSettings, is_admin: bool) -> frozenset[str]:
    """The privileges a caller may give its jobs: all for an admin token, what the operator allows otherwise."""
    if is_admin:
        return frozenset(PRIVILEGES)
    allowed = {
        CUSTOM_CODE: settings.allow_custom_code,
        HOST_PATHS: settings.allow_custom_code,
        UNSAFE_SANDBOX: settings.allow_unsafe_sandbox,
    }
    return frozenset(p for p, ok in allowed.items() if ok)


def dataset_references(spec: JobSpec) -> dict[str, DatasetParams]:
    """{field path prefix: params} of every dataset a spec reads (the training task's, the evaluation's)."""
    out: dict[str, DatasetParams] = {}
    if isinstance(task_params := spec.task.params, DatasetParams):
        out["task.params"] = task_params
    if spec.eval is not None and spec.eval.dataset is not None:
        out["eval.dataset"] = spec.eval.dataset
    return out


def check_datasets(
    spec: JobSpec, settings: ControlSettings, owns_dataset: Callable[[str], bool]
) -> list[Violation]:
    """A tenant's spec reads only its own uploads, or files under the operator's data root."""
    bad = []
    for prefix, params in dataset_references(spec).items():
        if params.dataset_id is not None and not owns_dataset(params.dataset_id):
            bad.append(
                Violation(
                    f"{prefix}.dataset_id",
                    f"no dataset {params.dataset_id!r} of yours; upload one "
                    "with `tgc data upload` (`tgc data list` shows yours)",
                )
            )
        if params.file is not None and settings.data_root is None:
            bad.append(
                Violation(
                    f"{prefix}.file",
                    "this server has no data root (setting data_root); upload the "
                    "file with `tgc data upload` and use dataset_id",
                )
            )
    return bad


def check_spec(
    spec: JobSpec,
    settings: ControlSettings,
    is_admin: bool,
    owns_dataset: Callable[[str], bool] | None = None,
) -> str:
    """Raise PolicyError listing every rule the spec breaks (field path + what to do); else return the
    job's grants (tgc_rl.tasks.grants.encode_grants): exactly the privileges the spec uses.
    `owns_dataset(id)`: whether the caller may read that uploaded dataset (None: no dataset may be named)."""
    bad: list[Violation] = check_datasets(spec, settings, owns_dataset or (lambda _: False))
    if spec.steps > settings.max_steps:
        bad.append(
            Violation("steps", f"at most {settings.max_steps} on this server; lower it or split the job")
        )
    replicas = spec.resources.learner_ranks + spec.resources.rollout_replicas
    if replicas > settings.max_replicas:
        bad.append(
            Violation(
                "resources",
                f"learner_ranks + rollout_replicas = {replicas} exceeds this server's limit of "
                f"{settings.max_replicas}; use fewer actors",
            )
        )
    if spec.sampling.max_new_tokens > settings.max_new_tokens:
        bad.append(Violation("sampling.max_new_tokens", f"at most {settings.max_new_tokens} on this server"))
    samples = spec.group_size * spec.prompts_per_step
    if samples > settings.max_samples_per_step:
        bad.append(
            Violation(
                "prompts_per_step",
                f"group_size * prompts_per_step = {samples} exceeds this server's limit of "
                f"{settings.max_samples_per_step} samples per step",
            )
        )
    if spec.traces.max_total_bytes > settings.max_trace_bytes:
        bad.append(
            Violation(
                "traces.max_total_bytes",
                f"{spec.traces.max_total_bytes} bytes; at most {settings.max_trace_bytes} "
                "on this server (setting max_trace_bytes): lower it (and steps_per_file x max_step_bytes to fit)",
            )
        )
    for path, value in (
        ("model.config_overrides", spec.model.config_overrides),
        ("task.params", spec.task.model_dump(mode="json")["params"]),  # the fields the tenant set
        ("env.params", spec.env.params if spec.env is not None else None),
        ("objective.overrides", spec.objective.overrides),
        # the same fields as task.params of a dataset task, so the same bound (what the tenant set)
        (
            "eval.dataset",
            spec.eval.dataset.model_dump(mode="json", exclude_unset=True)
            if spec.eval and spec.eval.dataset
            else None,
        ),
    ):
        if value is None:
            continue
        size = len(json.dumps(value))  # the schema already refused what is not plain, finite, shallow JSON
        if size > settings.max_free_form_bytes:
            bad.append(
                Violation(
                    path, f"{size} bytes of JSON; at most {settings.max_free_form_bytes} here: shorten it"
                )
            )
    allowed = set(settings.allowed_custom_resources)
    for field in ("learner_custom_resources", "rollout_custom_resources"):
        asked = sorted(set(getattr(spec.resources, field)) - allowed)
        if asked and not is_admin:  # a custom resource chooses nodes: the operator says which a tenant may
            bad.append(
                Violation(
                    f"resources.{field}",
                    f"{', '.join(asked)}: not a custom resource tenants may "
                    "ask for on this server (setting allowed_custom_resources), or use an admin token",
                )
            )
    needed = spec.privileges()
    for field, privilege in missing_grants(needed, caller_grants(settings, is_admin)).items():
        bad.append(Violation(field, _HOW_TO_GRANT[privilege]))
    if bad:
        raise PolicyError(bad)
    return encode_grants(set(needed.values()))
