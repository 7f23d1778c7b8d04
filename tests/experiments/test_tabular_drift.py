"""Testbed 1's key qualitative result, asserted on the CI-sized study: reward-irrelevant drift under grpo,
none under cp_grpo, and the residual that explains it (docs/objectives.md#the-tabular-toy)."""

import pytest

from experiments.report import View, load_results
from experiments.stats import compare, summarize

pytestmark = pytest.mark.slow  # the CI-sized study (tests/experiments/conftest.py)


def _view(ci_study):
    return View(load_results(ci_study)["tabular"])


def test_grpo_drifts_the_reward_irrelevant_style_choice(ci_study):
    p_verbose = summarize(_view(ci_study).values("grpo", "p_verbose"))
    assert (
        p_verbose.mean < 0.1
    )  # init 0.5: 1/|o_i| favours the short (concise) style although it earns nothing


def test_cp_grpo_leaves_the_reward_irrelevant_style_choice_undrifted(ci_study):
    values = _view(ci_study).values("cp_grpo", "p_verbose")
    assert 0.25 < summarize(values).mean < 0.75
    drift = compare(
        [abs(v - 0.5) for v in _view(ci_study).values("grpo", "p_verbose")], [abs(v - 0.5) for v in values]
    )
    assert drift.diff > 0.2 and drift.p_value < 0.05


def test_residual_is_nonzero_under_grpo_and_zero_under_cp_grpo(ci_study):
    view = _view(ci_study)
    assert summarize(view.values("grpo", "cancel_resid")).mean > 0.2  # ~|l- - l+|/(l- + l+) = 1/3
    assert max(view.values("cp_grpo", "cancel_resid")) < 1e-9


def test_both_learn_the_task(ci_study):
    from experiments.tabular import TabularPolicy, ToyConfig, snapshot

    view = _view(ci_study)
    start = snapshot(TabularPolicy(ToyConfig()), ToyConfig())["success"]
    for objective in ("grpo", "cp_grpo"):
        assert summarize(view.values(objective, "success")).mean > start + 0.05


def test_splitting_groups_across_optimizer_steps_breaks_cancellation(ci_study):
    view = _view(ci_study)
    whole, split = view.labels("split")
    assert max(view.values("cp_grpo", "cancel_resid", "split", whole)) < 1e-9
    assert summarize(view.values("cp_grpo", "cancel_resid", "split", split)).mean > 0.1
    assert min(view.values("cp_grpo", "diag/d4_groups_complete_frac", "split", whole)) == 1.0
    assert max(view.values("cp_grpo", "diag/d4_groups_complete_frac", "split", split)) == 0.0
