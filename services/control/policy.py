"""Server-side admission rules for a job spec, beyond what the schema itself enforces.

The schema (services.config) bounds each value; the operator may bound them tighter here, and a
shared service must also bound the free-form mappings and decide who may run their own code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.config import JobSpec, is_entry_point
from services.control.settings import ControlSettings

BUILTIN_MODEL_SOURCES = frozenset({"smollm2-135m-instruct", "random"})


@dataclass(frozen=True)
class Violation:
    field: str
    msg: str


class PolicyError(ValueError):
    def __init__(self, violations: list[Violation]):
        self.violations = violations
        super().__init__("; ".join(f"{v.field}: {v.msg}" for v in violations))


def _json_depth(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max((_json_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_json_depth(x) for x in v), default=0)
    return 0


def check_spec(spec: JobSpec, settings: ControlSettings, is_admin: bool) -> None:
    """Raise PolicyError listing every rule the spec breaks (field path + what to do)."""
    bad: list[Violation] = []
    if spec.steps > settings.max_steps:
        bad.append(Violation("steps", f"at most {settings.max_steps} on this server; lower it or split the job"))
    replicas = spec.resources.learner_ranks + spec.resources.rollout_replicas
    if replicas > settings.max_replicas:
        bad.append(Violation(
            "resources", f"learner_ranks + rollout_replicas = {replicas} exceeds this server's limit of "
            f"{settings.max_replicas}; use fewer actors",
        ))  # fmt: skip
    if spec.sampling.max_new_tokens > settings.max_new_tokens:
        bad.append(Violation("sampling.max_new_tokens", f"at most {settings.max_new_tokens} on this server"))
    samples = spec.group_size * spec.prompts_per_step
    if samples > settings.max_samples_per_step:
        bad.append(Violation(
            "prompts_per_step", f"group_size * prompts_per_step = {samples} exceeds this server's limit of "
            f"{settings.max_samples_per_step} samples per step",
        ))  # fmt: skip
    for path, value in (
        ("model.config_overrides", spec.model.config_overrides),
        ("task.params", spec.task.params),
        ("objective.overrides", spec.objective.overrides),
    ):
        try:
            size = len(json.dumps(value))
        except (TypeError, ValueError):
            bad.append(Violation(path, "must hold plain JSON values (numbers, strings, lists, mappings)"))
            continue
        if size > settings.max_free_form_bytes:
            bad.append(Violation(path, f"{size} bytes of JSON; at most {settings.max_free_form_bytes}"))
        if _json_depth(value) > 8:
            bad.append(Violation(path, "nested deeper than 8 levels; flatten it"))
    if not (is_admin or settings.allow_custom_code):
        if is_entry_point(spec.task.name):
            bad.append(Violation(
                "task.name", "custom code (`module:function`) needs an admin token on this server; use a "
                "built-in task or ask the operator to enable allow_custom_code",
            ))  # fmt: skip
        if spec.task.reward != "builtin":
            bad.append(Violation("task.reward", "custom reward functions need an admin token on this server"))
        if spec.model.source not in BUILTIN_MODEL_SOURCES:
            bad.append(Violation(
                "model.source", f"local model paths need an admin token on this server; use one of "
                f"{', '.join(sorted(BUILTIN_MODEL_SOURCES))}",
            ))  # fmt: skip
        if spec.model.tokenizer is not None:
            bad.append(Violation("model.tokenizer", "local tokenizer paths need an admin token on this server"))
    if bad:
        raise PolicyError(bad)
