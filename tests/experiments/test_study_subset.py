"""Running a part of a study (--objectives/--groups/--seeds) and reporting a part-run study honestly."""

import json

import pytest

from experiments import runner
from experiments.__main__ import main
from experiments.report import render
from experiments.studies import tinylm_study


def _fake_execute(testbed, config):
    """A stand-in for one training run: instant, with the drift a grpo-vs-cp_grpo comparison looks for."""
    drifts = config.objective != "cp_grpo"
    return {
        "config": {"seed": config.seed, "steps": config.steps},
        "curves": {},
        "eval_steps": [0],
        "seconds": 1.0,
        "final": {
            "eval/p_verbose": 0.05 + 0.01 * config.seed if drifts else 0.5 - 0.01 * config.seed,
            "diag/d1_gcpr": 0.3 if drifts else 0.0,
            "eval/steps_to_threshold": 50.0,
        },
    }


def test_select_filters_conditions_and_seeds():
    study = tinylm_study("full")
    runs = study.select(objectives=["grpo", "cp_grpo"], groups=["main"], seeds=[0, 1, 2])
    assert sorted((c.key, s) for c, s in runs) == sorted(
        (f"main/{o}", s) for o in ("grpo", "cp_grpo") for s in (0, 1, 2)
    )
    assert {c.group for c, _ in study.select(objectives=["grpo"])} == {
        "main",
        "epochs",
        "split",
        "group_size",
    }
    assert len(study.select()) == len(study.runs())
    for bad in ({"objectives": ["nope"]}, {"groups": ["gate"]}, {"seeds": [9]}):
        with pytest.raises(ValueError, match="has no"):
            study.select(**bad)


def test_parts_accumulate_in_the_cache_and_the_report_says_what_has_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "_execute", _fake_execute)
    out, cache = tmp_path / "results", tmp_path / "cache"
    common = ["tinylm", "--out", str(out), "--cache", str(cache), "--no-report", "--groups", "main"]
    assert main([*common, "--objectives", "grpo,cp_grpo", "--seeds", "0,1,2"]) == 0
    assert main([*common, "--objectives", "grpo", "--seeds", "3"]) == 0  # a later session extends the study
    res = json.loads((out / "tinylm.json").read_text())
    assert {c["key"]: c["seeds"] for c in res["conditions"]} == {
        "main/grpo": [0, 1, 2, 3],
        "main/cp_grpo": [0, 1, 2],
    }
    assert len(res["planned"]) == len(tinylm_study("full").conditions)

    text = render({"tinylm": res}, {}, report_dir=tmp_path)
    assert "Part-run study:** 7 of 110 planned runs" in text
    assert "cp_grpo (0-2)" in text  # fewer seeds than planned, named with its seeds
    assert (
        "*Data: 7 runs* (grpo: seeds 0-3; cp_grpo: seeds 0-2). *Seeds not run yet:* grpo: 4; cp_grpo: 3,4"
        in text
    )
    assert "| C2: " in text and "(7 runs, partial)" in text  # summary verdicts carry their run counts
    assert "| C9: " in text and "not run yet" in text  # group-size ablation: planned, nothing ran
    assert "| dapo |" not in text  # a condition that has not run is never a table row
    columns = {
        "Testbed 4": ({"C2": "reproduced (reward-irrelevant drift)"}, "How testbed 4 reads the claims."),
        "Empty": ({}, "A note of a column without cells."),
    }
    text = render({"tinylm": res}, {}, report_dir=tmp_path, columns=columns)
    assert "| claim | Testbed 2 | Testbed 4 |" in text  # a study without cells adds no column
    assert "How testbed 4 reads the claims." in text and "without cells" not in text
    c2 = next(ln for ln in text.splitlines() if ln.startswith("| C2: "))
    assert c2.endswith("| reproduced (reward-irrelevant drift) |")
    assert next(ln for ln in text.splitlines() if ln.startswith("| C9: ")).endswith("| — |")


def test_unknown_filter_names_fail_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["tinylm", "--out", str(tmp_path), "--cache", str(tmp_path), "--objectives", "grpo,typo"])
    assert not (tmp_path / "tinylm.json").exists()
