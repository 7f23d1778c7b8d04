"""The job spec is parsed once (issue 29, item 1): what the actors get are typed, resolved objects.

Each test parses a spec, then makes the parsers raise, then runs the part that consumes the spec in-process:
it must work from the typed objects it was handed.
"""

from __future__ import annotations

import dataclasses

import pytest

import rlcore
from services.config import JobSpec
from services.learner import LearnerSpec
from tests.learner.conftest import TINY_MODEL, build_spec


def _no_resolving(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError("the objective's overrides were resolved again after the spec was parsed")

    for module in ("rlcore", "rlcore.presets", "rlcore.objective", "services.config"):
        monkeypatch.setattr(f"{module}.resolve", refuse)


def test_a_learner_rank_gets_the_resolved_frozen_objective_with_the_async_default():
    job = JobSpec.parse(
        {"objective": {"name": "cp_grpo", "overrides": {"kl_coef": 0.05}}, "async": {"mode": "one_step_off"}}
    )
    spec = LearnerSpec.of(job)
    assert isinstance(spec.objective_config, rlcore.ObjectiveConfig)
    assert spec.objective_config == rlcore.resolve("cp_grpo", job.objective_overrides())
    assert spec.objective_config.kl_coef == 0.05 and spec.objective_config.behaviour_correction == "token_tis"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.objective_config.kl_coef = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "overrides", "reference", "entropies", "stages"),
    [
        ("cp_grpo", {}, False, False, 1),
        ("cp_grpo", {"kl_coef": 0.1}, True, False, 1),
        ("grpo", {"entropy_coef": 0.01}, False, True, 1),
        ("grpo", {"entropy_coef": -0.01}, False, True, 1),
        ("cp_grpo_lopti", {}, False, False, 2),
        ("cp_grpo_lopti", {"lopti_eta": -0.5}, False, False, 2),
    ],
)
def test_the_objective_says_what_it_needs(name, overrides, reference, entropies, stages):
    objective = rlcore.get_objective(name, **overrides)
    assert (objective.needs_reference, objective.needs_entropies, objective.stage_count) == (
        reference,
        entropies,
        stages,
    )


def test_the_learner_builds_what_the_objective_needs_from_the_resolved_config(monkeypatch, tmp_path):
    from services.config import ModelSpec
    from services.learner import Learner
    from services.models import model_dir

    model = model_dir(ModelSpec(**TINY_MODEL), seed=0)
    spec = LearnerSpec.of(
        build_spec(**{"objective.name": "cp_grpo_lopti", "objective.overrides": {"kl_coef": 0.1}})
    )
    _no_resolving(monkeypatch)
    learner = Learner(spec, model)
    assert learner.objective.config is spec.objective_config
    assert learner.uses_reference and learner.reference is not None
    assert learner.stages_per_batch == 2
