"""Across-seed statistics of the report."""

import math

import pytest

from experiments.stats import (
    compare,
    detectable_difference,
    direction,
    holm,
    permutation_p,
    pooled_sd,
    smallest_p,
    summarize,
    t_cdf,
    t_quantile,
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
    # t quantiles on 16 degrees of freedom (2.1199, 0.8647), not the normal's (1.9600, 0.8416): with a few
    # seeds the normal approximation claims about 6% more resolution than the design has
    assert d == pytest.approx((2.119905 + 0.864694) * math.sqrt(1 / 6 + 1 / 12), rel=1e-5)
    assert detectable_difference(1.0, 60, 120, 0.05) < d < detectable_difference(1.0, 6, 12, 0.05 / 16)
    assert math.isnan(detectable_difference(1.0, 1, 1, 0.05))  # no degrees of freedom


@pytest.mark.parametrize(
    ("q", "df", "expected"),
    [
        (0.975, 1, 12.706205),
        (0.975, 4, 2.776445),
        (0.975, 10, 2.228139),
        (0.8, 10, 0.879058),
        (0.995, 30, 2.749996),
    ],
)
def test_t_quantiles_match_the_tables(q, df, expected):
    assert t_quantile(q, df) == pytest.approx(expected, rel=1e-5)
    assert t_quantile(1 - q, df) == pytest.approx(-expected, rel=1e-5)
    assert t_cdf(expected, df) == pytest.approx(q, abs=1e-7)


def test_t_quantile_of_a_fractional_df_lies_between_its_neighbours_and_large_df_is_normal():
    assert t_quantile(0.975, 5) < t_quantile(0.975, 4.5) < t_quantile(0.975, 4)
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, rel=1e-6)
    assert math.isnan(t_quantile(1.0, 4)) and math.isnan(t_quantile(0.5, 0))


def test_a_difference_comes_with_welchs_interval():
    c = compare([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0])
    # variances of the means 5/12 and 5/3: Welch-Satterthwaite df = (25/12)^2 / ((5/12)^2/3 + (5/3)^2/3)
    assert c.df == pytest.approx(4.411765, rel=1e-6)
    low, high = c.ci()
    assert (low + high) / 2 == pytest.approx(-2.5)
    assert high - low == pytest.approx(2 * t_quantile(0.975, c.df) * math.sqrt(25 / 12))
    assert c.fmt_ci() == "-2.5 (95% CI -6.4 to +1.4)"
    assert compare([1.0, 1.0], [0.0, 0.0]).ci() == (1.0, 1.0)  # no spread: the difference itself
    assert all(math.isnan(x) for x in compare([1.0], [0.0, 1.0]).ci())


def test_direction_names_the_way_a_difference_points_against_its_prediction():
    assert direction(0.3, +1) == "the paper's direction"
    assert direction(0.3, -1, "Dr. GRPO") == "against Dr. GRPO's direction"
    assert direction(0.0, +1) == "no difference at all"
    assert direction(-0.25, 0) == "-0.25, no predicted direction"
