"""The behaviour correction in async jobs: on by default in `one_step_off` and `k_step` (token-level TIS,
C = 2), off in sync jobs, and what a user sets wins. That a real k_step job reports the correction's metrics is
asserted on tests/trainer/test_async.py's k_step job (`_assert_the_k_step_correction_is_reported`)."""

from __future__ import annotations

import json

import pytest
import torch

import rlcore
from rlcore.offpolicy import MISMATCH_KEYS
from tgc_rl import run_layout as rl
from tgc_rl.config import ASYNC_CORRECTION, JobSpec
from tgc_rl.learner.spec import LearnerSpec

ASYNC = {
    "sync": {},
    "one_step_off": {"mode": "one_step_off"},
    "k_step": {"mode": "k_step", "max_staleness": 2},
}


def _objective(spec: JobSpec) -> rlcore.ObjectiveConfig:
    """The objective's knobs as the learner ranks build them (LearnerSpec is all they see of the job)."""
    return LearnerSpec.of(spec).objective_config


@pytest.mark.parametrize("mode", ["one_step_off", "k_step"])
def test_async_modes_get_token_tis_with_cap_2_by_default(mode):
    spec = JobSpec.parse({"async": ASYNC[mode]})
    assert spec.objective.overrides == {}  # the spec as written is not changed: the default is resolved
    cfg = _objective(spec)
    assert (cfg.behaviour_correction, cfg.behaviour_cap) == (ASYNC_CORRECTION, 2.0) == ("token_tis", 2.0)
    assert rlcore.get_objective("cp_grpo", **spec.objective_overrides()).preserves_cancellation


def test_sync_jobs_are_unchanged():
    spec = JobSpec.parse({})
    assert spec.objective_overrides() == {} and _objective(spec).behaviour_correction == "none"


@pytest.mark.parametrize("mode", ["one_step_off", "k_step"])
@pytest.mark.parametrize("chosen", ["none", "token_mask", "seq_tis"])
def test_a_correction_the_user_sets_wins_and_none_turns_it_off(mode, chosen):
    overrides = {"behaviour_correction": chosen, "behaviour_cap": 3.0}
    spec = JobSpec.parse({"async": ASYNC[mode], "objective": {"overrides": overrides}})
    cfg = _objective(spec)
    assert (cfg.behaviour_correction, cfg.behaviour_cap) == (chosen, 3.0)


def test_a_cap_alone_keeps_the_default_correction_with_that_cap():
    spec = JobSpec.parse({"async": ASYNC["k_step"], "objective": {"overrides": {"behaviour_cap": 1.5}}})
    cfg = _objective(spec)
    assert (cfg.behaviour_correction, cfg.behaviour_cap) == ("token_tis", 1.5)


def test_gmpo_has_no_correction_defined_and_stays_uncorrected_in_async_modes():
    spec = JobSpec.parse({"async": ASYNC["one_step_off"], "objective": {"name": "gmpo"}})
    assert _objective(spec).behaviour_correction == "none"


def test_the_schema_says_how_the_default_is_turned_off():
    schema = json.dumps(JobSpec.model_json_schema(by_alias=True))
    assert "behaviour_correction: token_tis" in schema and "behaviour_correction: none" in schema


def test_the_watched_off_policy_names_are_the_ones_rlcore_and_the_learner_emit():
    # the learner reports rlcore's mismatch keys as they are and the objective's metrics under `objective/`
    assert {rl.MISMATCH_K3, rl.MISMATCH_SPREAD_MEAN, rl.MISMATCH_SPREAD_MAX} <= set(MISMATCH_KEYS)
    obj = rlcore.get_objective("cp_grpo", behaviour_correction="token_tis")
    old = torch.tensor([[-1.0, -2.0], [-1.0, -0.5]])
    args = (old.clone(), old, torch.tensor([1.0, -1.0]), torch.ones(2, 2), torch.tensor([0, 0]))
    out = obj.loss(*args, behaviour_logprobs=old - 1.0)
    frac = out.metrics[rl.BEHAVIOUR_CORRECTED_FRAC.removeprefix("objective/")]
    assert float(frac) == 1.0  # w = e > C = 2 on every token


# A real k_step job's correction metrics are asserted on tests/trainer/test_async.py's k_step job (the same
# spec: k = 2, 3 steps, temperature 0.1, then resumed): one job start for both.
