"""What a job asks of a Ray cluster, and the one error when the cluster cannot provide it: the trainer checks the
whole job before any actor starts, a learner group its own ranks before it reserves anything. No Ray import:
the numbers come from the caller (`ray.cluster_resources()`, a local machine's capacity)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

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

    def refusal(kind: str, need: float, have: float) -> str:
        per = _PER[kind]
        return (
            f"resources: the job needs {need:g} {kind}s (learner_ranks x {per}_per_learner + rollout_replicas "
            f"x {per}_per_rollout) but the cluster has {have:g}; lower resources.{per}_per_learner / "
            f"{per}_per_rollout or the counts, or use a bigger cluster"
        )

    _refuse_shortfall(required_resources(spec), available, refusal)


def check_learner_fits(spec: JobSpec, available: Mapping[str, float]) -> None:
    """Refuse a learner group the cluster can never place (its actors would wait forever), naming the fields."""
    r = spec.resources
    per_rank = {"CPU": r.cpus_per_learner, "GPU": r.gpus_per_learner}

    def refusal(kind: str, need: float, have: float) -> str:
        name = f"{_PER[kind]}_per_learner"
        return (
            f"resources: {r.learner_ranks} learner ranks x {name} {per_rank[kind]:g} need {need:g} {kind}s "
            f"but the Ray cluster has {have:g}; lower resources.learner_ranks or resources.{name}"
        )

    _refuse_shortfall({kind: r.learner_ranks * n for kind, n in per_rank.items()}, available, refusal)


# The spec's field prefix of each kind the roles ask for (`cpus_per_learner`, `gpus_per_rollout`, ...).
_PER = {"CPU": "cpus", "GPU": "gpus"}


def _refuse_shortfall(
    need: Mapping[str, float], available: Mapping[str, float], refusal: Callable[[str, float, float], str]
) -> None:
    """Raise ResourceError, worded by `refusal(kind, need, have)`, for the first kind the cluster has less of
    than needed; a kind it does not list counts as none, and float sums get a rounding margin."""
    for kind, amount in need.items():
        have = available.get(kind, 0.0)
        if amount > have + 1e-9:
            raise ResourceError(refusal(kind, amount, have))


def check_custom_resources(role: str, custom: Mapping[str, float], available: Mapping[str, float]) -> None:
    """Refuse custom resources (`resources.<role>_custom_resources`) that no node of the cluster has."""
    missing = [k for k, v in custom.items() if v > 0 and available.get(k, 0.0) <= 0]
    if missing:
        raise ResourceError(
            f"resources.{role}_custom_resources: no node of the Ray cluster has {', '.join(missing)}; start the "
            f"nodes meant for the {role} with `ray start --resources` naming them, or remove them from the spec"
        )
