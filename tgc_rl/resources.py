"""What a job asks of a Ray cluster, and the one error when the cluster cannot provide it: the trainer checks the
whole job before any actor starts, a learner group its own ranks before it reserves anything. No Ray import:
the numbers come from the caller (`ray.cluster_resources()`, a local machine's capacity)."""

from __future__ import annotations

from collections.abc import Mapping

from tgc_rl.config import JobSpec


class ResourceError(ValueError):
    """The spec asks for resources the cluster cannot provide."""


def required_resources(spec: JobSpec) -> dict[str, float]:
    r = spec.resources
    return {
        "CPU": r.learner_ranks * r.cpus_per_learner
        + r.rollout_replicas * r.cpus_per_rollout
        + spec.task.reward_workers,  # the reward actor reserves one CPU per verifier worker process
        "GPU": r.learner_ranks * r.gpus_per_learner + r.rollout_replicas * r.gpus_per_rollout,
    }


def check_resources(spec: JobSpec, available: Mapping[str, float]) -> None:
    """Refuse a job the cluster cannot hold at once (CPUs and GPUs of every role, the roles' custom resources),
    naming the fields."""
    r = spec.resources
    check_custom_resources("learner", r.learner_custom_resources, available)
    check_custom_resources("rollout", r.rollout_custom_resources, available)
    need = required_resources(spec)
    for kind, field_names in (
        ("CPU", "cpus_per_learner / cpus_per_rollout"),
        ("GPU", "gpus_per_learner / gpus_per_rollout"),
    ):
        if need[kind] > available.get(kind, 0.0) + 1e-9:
            raise ResourceError(
                f"resources: the job needs {need[kind]:g} {kind}s (learner_ranks x {field_names.split(' / ')[0]} "
                f"+ rollout_replicas x {field_names.split(' / ')[1]}) but the cluster has "
                f"{available.get(kind, 0.0):g}; lower resources.{field_names} or the counts, or use a bigger cluster"
            )


def check_learner_fits(spec: JobSpec, available: Mapping[str, float]) -> None:
    """Refuse a learner group the cluster can never place (its actors would wait forever), naming the fields."""
    r = spec.resources
    for kind, per_rank, name in (
        ("CPU", r.cpus_per_learner, "cpus_per_learner"),
        ("GPU", r.gpus_per_learner, "gpus_per_learner"),
    ):
        need = r.learner_ranks * per_rank
        if need > available.get(kind, 0.0) + 1e-9:
            raise ResourceError(
                f"resources: {r.learner_ranks} learner ranks x {name} {per_rank:g} need {need:g} {kind}s "
                f"but the Ray cluster has {available.get(kind, 0.0):g}; lower resources.learner_ranks "
                f"or resources.{name}"
            )


def check_custom_resources(role: str, custom: Mapping[str, float], available: Mapping[str, float]) -> None:
    """Refuse custom resources (`resources.<role>_custom_resources`) that no node of the cluster has."""
    missing = [k for k, v in custom.items() if v > 0 and available.get(k, 0.0) <= 0]
    if missing:
        raise ResourceError(
            f"resources.{role}_custom_resources: no node of the Ray cluster has {', '.join(missing)}; start the "
            f"nodes meant for the {role} with `ray start --resources` naming them, or remove them from the spec"
        )
