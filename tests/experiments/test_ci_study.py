"""The CI-sized study runs end to end and renders its report."""

import json

import pytest

from experiments.report import CLAIMS, load_results

pytestmark = pytest.mark.slow  # the CI-sized study (tests/experiments/conftest.py)


def test_ci_study_writes_results_for_testbeds_one_and_two(ci_study):
    results = load_results(ci_study)
    assert set(results) == {"tabular", "tinylm"}
    for res in results.values():
        assert res["size"] == "ci"
        for cond in res["conditions"]:
            assert len(cond["seeds"]) == len(res["seeds"])
            assert all(len(vals) == len(cond["seeds"]) for vals in cond["final"].values())


def test_ci_study_renders_figures(ci_study):
    pngs = sorted(p.name for p in ci_study.glob("*.png"))
    assert {
        "tabular_ci_main.png",
        "tabular_ci_curves.png",
        "tinylm_ci_main.png",
        "tinylm_ci_curves.png",
    } <= set(pngs)
    assert all((ci_study / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_ci_report_states_every_claim_with_a_verdict(ci_study):
    report = (ci_study / "REPORT.md").read_text()
    for claim in CLAIMS:
        assert f"### {claim.ident}." in report
    summary = report.split("## Summary")[1].split("## What ran")[0]
    assert summary.count("| C") == len(CLAIMS)
    assert "reproduced" in summary
    for png in ci_study.glob("*.png"):
        assert f"]({png.name})" in report


def test_ci_results_are_small_json(ci_study):
    for path in ci_study.glob("*.json"):
        json.loads(path.read_text())
        assert path.stat().st_size < 200_000
