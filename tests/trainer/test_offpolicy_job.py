"""The behaviour correction in async jobs: on by default in `one_step_off` and `k_step` (token-level TIS,
C = 2), off in sync jobs, and what a user sets wins; a real k_step job reports the correction's metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch

import rlcore
from rlcore.offpolicy import MISMATCH_KEYS
from services import run_layout as rl
from services.config import ASYNC_CORRECTION, JobSpec
from services.learner.spec import LearnerSpec

from .conftest import read_metrics, tiny_spec

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


@pytest.mark.slow
def test_a_k_step_job_trains_with_token_tis_and_reports_the_correction(ray_cluster, tmp_path):
    from services.trainer.main import run

    mode = {"async.mode": "k_step", "async.max_staleness": 2, "checkpoint.every_steps": 0}
    # sharper sampling from the random model: once it has learned a little, a group's responses share tokens
    spec = tiny_spec(steps=3, **mode, **{"sampling.temperature": 0.1})
    assert run(spec, tmp_path) == "succeeded"  # no override: the async default applies
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 0.0 <= r[rl.BEHAVIOUR_CORRECTED_FRAC] <= 1.0  # only reported where a correction runs
        assert 0.0 < r["objective/behaviour/coef_mean"] <= 2.0  # min(w, C = 2)
        assert math.isfinite(r[rl.MISMATCH_K3]) and r[rl.MISMATCH_K3] >= 0.0
        # the spread is measured where copies of a shared token exist; one version sampled each group with one
        # engine, so the copies' behaviour log-probs agree and token TIS keeps cancellation
        assert (rl.MISMATCH_SPREAD_MAX in r) == (r["mismatch/shared_pairs"] > 0)
        assert 0.0 <= r.get(rl.MISMATCH_SPREAD_MEAN, 0.0) <= r.get(rl.MISMATCH_SPREAD_MAX, 0.0) <= 1e-5
        assert r.get(rl.D2_RESIDUAL, 0.0) <= 1e-4  # the TgcCancellationBroken alert's threshold
    assert any(r["mismatch/shared_pairs"] > 0 for r in rows)
    lags = [r[rl.POLICY_STALENESS_MAX] for r in rows]
    assert lags[0] == 0 and max(lags) > 0 and all(lag <= 2 for lag in lags)
    # the lag is what the correction sees: a step sampled by weights a version or two old is further from the
    # learner's pi_old than step 1, where engine and learner hold the same weights (numerics only)
    lagged = lags.index(max(lags))
    assert rows[lagged][rl.MISMATCH_K3] > 100 * rows[0][rl.MISMATCH_K3]
    assert rows[lagged][rl.BEHAVIOUR_CORRECTED_FRAC] > 0.0 == rows[0][rl.BEHAVIOUR_CORRECTED_FRAC]
