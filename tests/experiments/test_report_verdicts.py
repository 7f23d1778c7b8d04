"""The report's verdicts follow their printed rules (constructed results in the compact format)."""

from experiments.report import CLAIMS, View, check_drift, check_entropy, check_residual, check_trainer, render


def _results(grpo_pv, cp_pv, grpo_d1=(0.3, 0.31, 0.32, 0.3, 0.29), cp_d1=(0.0,) * 5):
    def cond(obj, pv, d1):
        return {
            "key": f"main/{obj}",
            "group": "main",
            "objective": obj,
            "label": "main",
            "setting": {},
            "preset": obj,
            "overrides": {},
            "seeds": [0, 1, 2, 3, 4],
            "curves": {},
            "seconds": [1.0] * 5,
            "final": {"p_verbose": list(pv), "cancel_resid": list(d1)},
        }

    return {
        "study": "t",
        "testbed": "tabular",
        "size": "ci",
        "seeds": [0, 1, 2, 3, 4],
        "created": "now",
        "command": "python -m experiments ci",
        "base": {"group_size": 8, "epochs": 4},
        "conditions": [cond("grpo", grpo_pv, grpo_d1), cond("cp_grpo", cp_pv, cp_d1)],
    }


def test_clear_drift_gap_is_reproduced():
    f = check_drift(View(_results([0.01, 0.02, 0.01, 0.03, 0.02], [0.4, 0.6, 0.5, 0.45, 0.55])))
    assert f.verdict == "reproduced"


def test_reversed_gap_is_reported_as_opposite():
    f = check_drift(View(_results([0.4, 0.6, 0.5, 0.45, 0.55], [0.01, 0.02, 0.01, 0.03, 0.02])))
    assert f.verdict == "opposite"


def test_overlapping_seeds_are_not_significant():
    f = check_drift(View(_results([0.3, 0.7, 0.2, 0.8, 0.5], [0.35, 0.65, 0.3, 0.6, 0.5])))
    assert f.verdict in ("same direction, n.s.", "not reproduced")


def test_residual_rule_flags_an_exchangeable_objective_with_a_residual():
    f = check_residual(View(_results([0.0] * 5, [0.5] * 5, cp_d1=(0.2,) * 5)))
    assert f.verdict == "partly" and "cp_grpo" in f.text


def test_render_lists_every_claim_and_marks_unmeasured_ones():
    text = render(
        {"tabular": _results([0.01] * 5, [0.5] * 5)}, {}, report_dir=__import__("pathlib").Path(".")
    )
    for claim in CLAIMS:
        assert f"### {claim.ident}." in text
    assert "Not measured by the studies in this report." in text


def _trainer_results(grpo: dict, cp: dict) -> dict:
    def cond(obj, final):
        return {
            "key": f"main/{obj}",
            "group": "main",
            "objective": obj,
            "label": "arithmetic",
            "setting": {},
            "preset": obj,
            "overrides": {},
            "seeds": [0, 1, 2],
            "curves": {},
            "seconds": [1.0] * 3,
            "final": final,
        }

    return {
        "study": "trainer",
        "testbed": "trainer",
        "size": "full",
        "seeds": [0, 1, 2],
        "created": "now",
        "command": "python -m experiments trainer",
        "base": {},
        "conditions": [cond("grpo", grpo), cond("cp_grpo", cp)],
    }


def test_trainer_claim_rests_on_d2_when_no_token_is_common_to_a_whole_group():
    none = [None] * 3  # D1: no group-common prefix in any step
    f = check_trainer(
        View(
            _trainer_results(
                {"diag/d1_gcpr": none, "diag/d2_residual": [0.2, 0.3, 0.25]},
                {"diag/d1_gcpr": none, "diag/d2_residual": [1e-8, 2e-8, 0.0]},
            )
        )
    )
    assert f.verdict == "reproduced" and "D2" in f.text
    f = check_trainer(
        View(
            _trainer_results({"diag/d2_residual": [0.2, 0.3, 0.25]}, {"diag/d2_residual": [0.01, 0.02, 0.01]})
        )
    )
    assert f.verdict == "not reproduced"


def test_trainer_claim_falls_back_to_d1_and_says_when_nothing_was_measured():
    f = check_trainer(View(_trainer_results({"diag/d1_gcpr": [0.3] * 3}, {"diag/d1_gcpr": [0.0] * 3})))
    assert f.verdict == "reproduced" and "D1" in f.text
    assert check_trainer(View(_trainer_results({}, {}))).verdict == "not measured"


def test_common_prefix_entropy_is_not_measured_where_no_group_shared_a_prefix():
    none = [None] * 3
    f = check_entropy(
        View(
            _trainer_results(
                {"diag/d1_gcpr": none, "diag/d7_entropy_common": [0.0] * 3},
                {"diag/d1_gcpr": none, "diag/d7_entropy_common": [0.0] * 3},
            )
        )
    )
    assert f.verdict == "not measured" and "no common-prefix positions" in f.text
    f = check_entropy(
        View(
            _trainer_results(
                {"diag/d1_gcpr": [0.3] * 5, "diag/d7_entropy_common": [0.2, 0.21, 0.2, 0.22, 0.2]},
                {"diag/d1_gcpr": [0.0] * 5, "diag/d7_entropy_common": [0.6, 0.61, 0.6, 0.62, 0.6]},
            )
        )
    )
    assert f.verdict == "reproduced"


def test_trainer_claim_covers_every_task_and_needs_each_to_agree():
    def second_task(results, grpo_d2, cp_d2):
        for obj, d2 in (("grpo", grpo_d2), ("cp_grpo", cp_d2)):
            results["conditions"].append(
                {
                    "key": f"task:basic_arithmetic/{obj}",
                    "group": "task:basic_arithmetic",
                    "objective": obj,
                    "label": "basic_arithmetic",
                    "setting": {},
                    "preset": obj,
                    "overrides": {},
                    "seeds": [0, 1],
                    "curves": {},
                    "seconds": [1.0] * 2,
                    "final": {"diag/d2_residual": d2},
                }
            )
        return results

    base = {"diag/d2_residual": [0.2, 0.3, 0.25]}, {"diag/d2_residual": [0.0] * 3}
    f = check_trainer(View(second_task(_trainer_results(*base), [0.1, 0.12], [0.0, 1e-9])))
    assert f.verdict == "reproduced" and "On arithmetic" in f.text and "On basic_arithmetic" in f.text
    assert [row[:3] for row in f.table[1:]] == [
        ["arithmetic", "grpo", "3"],
        ["arithmetic", "cp_grpo", "3"],
        ["basic_arithmetic", "grpo", "2"],
        ["basic_arithmetic", "cp_grpo", "2"],
    ]
    f = check_trainer(View(second_task(_trainer_results(*base), [0.1, 0.12], [0.05, 0.04])))
    assert f.verdict == "not reproduced"
