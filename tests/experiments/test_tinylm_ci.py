"""Testbed 2 in the CI-sized study: the tiny LM trains with rlcore objectives and its diagnostics work."""

import pytest

from experiments.report import View, load_results
from experiments.stats import summarize

pytestmark = pytest.mark.slow  # the CI-sized study (tests/experiments/conftest.py)


def _view(ci_study):
    return View(load_results(ci_study)["tinylm"])


def test_cancellation_residual_is_zero_for_cp_grpo_and_positive_for_grpo_in_the_tiny_lm(ci_study):
    view = _view(ci_study)
    assert max(view.values("cp_grpo", "diag/d1_gcpr")) < 1e-5  # float32 model: rounding-level residual
    assert summarize(view.values("grpo", "diag/d1_gcpr")).mean > 0.01


def test_tiny_lm_runs_measure_probe_drift_and_entropies(ci_study):
    view = _view(ci_study)
    for objective in ("grpo", "cp_grpo"):
        assert min(view.values(objective, "probe/kl")) > 0  # the policy moved, and so did unrelated contexts
        assert summarize(view.values(objective, "diag/d7_entropy_mean")).n == 2
        assert summarize(view.values(objective, "rollout/entropy_forking")).mean > 0
