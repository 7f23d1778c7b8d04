"""Across-seed statistics of the report."""

import math

import pytest

from experiments.stats import (
    compare,
    detectable_difference,
    holm,
    permutation_p,
    pooled_sd,
    smallest_p,
    summarize,
)


def test_summary_is_mean_and_standard_error():
    s = summarize([1.0, 2.0, 3.0, float("nan")])
    assert s.n == 3 and s.mean == 2.0
    assert s.se == pytest.approx(1.0 / math.sqrt(3))


def test_exact_permutation_p_of_fully_separated_samples():
    # 5 vs 5, fully separated: only the observed split and its mirror are as extreme: 2 / C(10, 5)
    assert permutation_p([10, 11, 12, 13, 14], [0, 1, 2, 3, 4]) == pytest.approx(2 / 252)


def test_permutation_p_is_one_for_identical_samples():
    assert permutation_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0


def test_comparison_reports_difference_and_combined_error():
    c = compare([2.0, 4.0], [1.0, 1.0])
    assert c.diff == 2.0
    assert c.se == pytest.approx(1.0)
    assert "p=" in c.fmt()


def test_summary_keeps_significant_digits_of_a_small_standard_error():
    # a seed-to-seed spread of 0.004 around 0.004 must not print as "± 0"
    s = summarize([0.0, 0.0, 0.0117])
    assert s.fmt() == "0.0039 ± 0.0039"
    assert summarize([0.052, 0.0525, 0.0515]).fmt() == "0.052 ± 2.9e-04"
    assert summarize([5e-9, 4e-9]).fmt() == "4.50e-09 ± 5.0e-10"


def test_holm_adjusts_step_down_keeps_order_and_skips_missing_tests():
    # sorted 0.01, 0.02, 0.04 of m = 3: 3 x 0.01, max(0.03, 2 x 0.02), max(0.04, 1 x 0.04)
    assert holm([0.04, 0.01, float("nan"), 0.02]) == pytest.approx([0.04, 0.03, math.nan, 0.04], nan_ok=True)
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert holm([]) == []


def test_smallest_p_is_what_complete_separation_gives():
    assert smallest_p(5, 5) == pytest.approx(permutation_p([10, 11, 12, 13, 14], [0, 1, 2, 3, 4]))
    assert smallest_p(2, 3) == pytest.approx(permutation_p([10, 11], [0, 1, 2]))
    assert smallest_p(6, 12) == pytest.approx(1 / 18_564)


def test_a_comparison_with_one_run_on_a_side_is_a_difference_without_a_test():
    assert compare([2.0], [1.0, 1.5]).fmt() == "0.75 (one run)"


def test_pooled_sd_removes_each_groups_mean_and_the_detectable_difference_shrinks_with_runs():
    assert pooled_sd([[1.0, 3.0], [11.0, 13.0], [5.0]]) == pytest.approx(math.sqrt(2.0))  # group gaps ignored
    assert math.isnan(pooled_sd([[1.0], [2.0]]))
    d = detectable_difference(1.0, 6, 12, 0.05)
    assert d == pytest.approx((1.959964 + 0.841621) * math.sqrt(1 / 6 + 1 / 12), rel=1e-5)
    assert detectable_difference(1.0, 60, 120, 0.05) < d < detectable_difference(1.0, 6, 12, 0.05 / 16)
