"""Testbed 3's job specs and metric reduction (the runs themselves are in test_trainer_runs)."""

import json

import pytest

from experiments.trainer_study import (
    TASKS,
    aggregate,
    plan_runs,
    select_runs,
    study_plan,
    summarise_metrics,
    write_results,
)
from tgc_rl.config import JobSpec
from tgc_rl.tasks import load_task


@pytest.mark.parametrize("size", ["tiny", "small", "full"])
def test_every_planned_run_is_a_valid_job_spec(size):
    runs = plan_runs(size)
    plan = study_plan(size)
    assert len(runs) == len(plan["objectives"]) * len(plan["tasks"]) * len(plan["seeds"])
    names = set()
    for _, seed, spec in runs:
        parsed = JobSpec.parse(spec)
        assert parsed.seed == seed
        names.add(parsed.name)
    assert len(names) == len(runs)


def test_full_plan_compares_the_issue_objectives_on_two_tasks_with_three_seeds():
    plan = study_plan("full")
    assert set(plan["objectives"]) >= {
        "grpo",
        "dr_grpo",
        "dapo",
        "gspo",
        "cispo",
        "dfpo_min",
        "dfpo_orth",
        "cp_grpo",
        "grpo_ar",
        "grpo_lopti",
    }
    assert len(plan["seeds"]) == 3 and len(plan["tasks"]) == 2


@pytest.mark.parametrize("task", sorted(TASKS))
def test_study_tasks_load_and_score_their_own_answer(task):
    spec = TASKS[task]
    t = load_task(spec["name"], spec["params"], seed=0)
    item = t.item(0)
    assert t.score(item, str(item.answer)).reward == 1.0


def test_metrics_reduce_to_curves_final_tail_means_and_threshold_step():
    points = [
        {"step": s, "reward/accuracy": a, "diag/d1_gcpr": 0.1 * s}
        for s, a in zip(range(1, 9), [0.1, 0.2, 0.5, 0.8, 0.7, 0.9, 0.9, 1.0], strict=True)
    ]
    out = summarise_metrics(reversed(points))
    assert out["steps"] == list(range(1, 9))
    assert out["curves"]["reward/accuracy"][3] == 0.8
    assert out["final"]["reward/accuracy"] == pytest.approx(0.95)  # mean of the last quarter (2 steps)
    assert out["final"]["steps_to_threshold"] == 4.0
    assert out["final"]["diag/d7_entropy_mean"] != out["final"]["diag/d7_entropy_mean"]  # absent -> NaN


def test_metrics_of_a_run_without_steps_are_refused():
    with pytest.raises(ValueError, match="no step"):
        summarise_metrics([])


def test_a_part_of_the_study_can_be_selected_and_unknown_names_are_refused():
    runs = select_runs("full", objectives=["grpo", "cp_grpo"], tasks=["arithmetic"], seeds=[1])
    assert sorted(spec["name"] for _, _, spec in runs) == [
        "tgc-exp-cp-grpo-arithmetic-s1",
        "tgc-exp-grpo-arithmetic-s1",
    ]
    assert len(select_runs("full")) == len(plan_runs("full"))
    with pytest.raises(ValueError, match="--objectives: nope not in the full plan"):
        select_runs("full", objectives=["nope"])
    with pytest.raises(ValueError, match="--seeds: 7"):
        select_runs("full", seeds=[7])


def test_results_of_a_part_run_list_every_planned_condition():
    plan = study_plan("full")
    cond, seed, _ = select_runs("full", objectives=["grpo"], tasks=["arithmetic"], seeds=[0])[0]
    summary = summarise_metrics([{"step": 1, "reward/accuracy": 0.5, "diag/d2_residual": 0.2}])
    out = aggregate(plan, [(cond, seed, summary)])
    assert [c["objective"] for c in out["conditions"]] == ["grpo"]
    assert len(out["planned"]) == len(plan["objectives"]) * len(plan["tasks"])
    assert out["conditions"][0]["final"]["diag/d2_residual"] == [0.2]


def _results_of(objective, task="arithmetic"):
    plan = study_plan("full")
    cond, seed, _ = select_runs("full", objectives=[objective], tasks=[task], seeds=[0])[0]
    summary = summarise_metrics([{"step": 1, "reward/accuracy": 0.5, "diag/d2_residual": 0.2}])
    return plan, (cond, seed, summary)


def test_a_later_part_keeps_the_earlier_parts_conditions_in_plan_order(tmp_path):
    plan, later = _results_of("grpo", "basic_arithmetic")
    _, earlier = _results_of("gspo")
    first = json.loads(write_results(plan, [earlier], tmp_path, log=lambda m: None).read_text())
    merged = json.loads(write_results(plan, [later], tmp_path, log=lambda m: None).read_text())
    assert [c["key"] for c in merged["conditions"]] == [first["conditions"][0]["key"], later[0].key]
    assert merged["conditions"][0]["carried_from"] == first["created"]
    assert "carried_from" not in merged["conditions"][1]
    # a condition that has run summaries now replaces the earlier file's entry instead of doubling it
    again = json.loads(write_results(plan, [earlier, later], tmp_path, log=lambda m: None).read_text())
    assert [("carried_from" in c) for c in again["conditions"]] == [False, False]


def test_conditions_made_under_other_settings_are_not_carried_over(tmp_path):
    plan, earlier = _results_of("gspo")
    write_results(plan, [earlier], tmp_path, log=lambda m: None)
    _, later = _results_of("grpo")
    lines = []
    merged = json.loads(write_results({**plan, "lr": 1e-5}, [later], tmp_path, log=lines.append).read_text())
    assert [c["objective"] for c in merged["conditions"]] == ["grpo"]
    assert any("dropping 1 condition" in line and "other settings" in line for line in lines)
