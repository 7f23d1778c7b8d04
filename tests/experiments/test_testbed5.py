"""Testbed 5's harness without training: the data and its verifier, the job specs, the pilot's decision rules
on synthetic numbers, the study's refusal before the pilot, and the report's statistics on synthetic runs."""

import json
import math
from pathlib import Path

import pytest

from experiments import stats, testbed5, testbed5_report
from experiments.testbed5 import CapStats, CutSample, Decisions, LrTrial
from tgc_rl.config import JobSpec
from tgc_rl.tasks.dataset import score_row


def test_held_out_pairs_are_held_out_in_both_orders_and_the_committed_files_are_the_draw():
    train, held = testbed5.addition_rows()
    assert len(train) + len(held) == (testbed5.MAX_OPERAND + 1) ** 2
    held_pairs = {frozenset((r["a"], r["b"])) for r in held}
    assert len(held_pairs) == testbed5.HELDOUT_PAIRS
    assert not held_pairs & {frozenset((r["a"], r["b"])) for r in train}  # commuted training rows too
    assert {(r["b"], r["a"]) for r in held} == {(r["a"], r["b"]) for r in held}
    doubles = sum(r["a"] == r["b"] for r in held)
    assert len(held) == 2 * testbed5.HELDOUT_PAIRS - doubles and 480 < len(held) <= 500
    assert all(r["verifier"] == "regex" and r["answer"] == testbed5.pattern(r["a"] + r["b"]) for r in held)
    assert train[0]["prompt"] == (
        "What is 0 + 0? Explain your steps briefly. End your reply with the line 'Answer: <number>', "
        "where <number> is 0 + 0."
    )
    # the periodic evaluation set (the first 128) is a mix of pairs, not one corner of the grid
    first = held[: testbed5.EVAL_PROMPTS]
    assert len({r["a"] // 10 for r in first}) == testbed5.MAX_OPERAND // 10 + 1
    assert testbed5.addition_rows() == (train, held)
    pilot = testbed5.pilot_rows(train)
    assert len(pilot) == 64 and {r["id"] for r in pilot} <= {r["id"] for r in train}
    files = testbed5.write_data()  # the committed files are this draw (rewritten only if it changed)
    assert testbed5.read_rows(files.train) == train and testbed5.read_rows(files.heldout) == held


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("70 + 50 = 120, 5 + 8 = 13. Answer: 133", 1.0),
        ("75 + 58\n\n**Answer:** 133.", 1.0),
        ("answer: 133", 1.0),
        ("133", 1.0),
        ("75 + 58 = 133", 1.0),  # the asked-for "Answer:" line is not needed: the last number counts
        ("Answer: 133 Answer: 12", 0.0),  # several candidates: only the last counts
        ("Answer: 12 or 133", 1.0),
        ("First, 70 + 50 = 120. Then 5 + 8 = 13, so the total", 0.0),  # cut off before its answer
        ("Answer: 1330", 0.0),
        ("Answer: 2133", 0.0),  # the tail of a longer number
        ("Answer: 0.133", 0.0),
        ("Answer: 133.5", 0.0),
        ("Answer: 133 (checked in 2 steps)", 0.0),
    ],
)
def test_the_rows_pattern_through_the_dataset_tasks_loader_and_scorer(tmp_path, response, reward):
    row = next(r for r in testbed5.addition_rows(99)[0] if r["id"] == "add-75-58")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    item = testbed5.dataset_items(path)["add-75-58"]
    assert item.meta["verifier"] == "regex"
    assert score_row(item, response, lambda *_: None).reward == reward


DECIDED = Decisions(cap=128, base_accuracy=0.1, lr=3e-5, design=testbed5.FULL)


def test_study_specs_are_valid_jobs_in_alternating_order_with_the_pilots_settings():
    specs = testbed5.study_specs(DECIDED)
    assert [s["name"] for s in specs[:4]] == [
        "tb5-grpo-s0",
        "tb5-cp-grpo-s0",
        "tb5-grpo-s1",
        "tb5-cp-grpo-s1",
    ]
    assert len(specs) == 12
    for d in specs:
        spec = JobSpec.parse(d)
        assert spec.steps == 100 and spec.sampling.max_new_tokens == 128 and spec.optim.lr == 3e-5
        assert spec.group_size == spec.prompts_per_step == 8 and spec.sampling.temperature == 0.7
        assert spec.eval is not None and spec.eval.every_steps == 10 and spec.eval.max_prompts == 128
        assert spec.eval.samples_per_prompt == 4 and spec.eval.also_greedy and not spec.eval.greedy
        assert spec.checkpoint.every_steps == 10 and spec.checkpoint.keep_last == 11  # all kept until probed
        final = JobSpec.parse(testbed5.final_spec(d))
        assert final.steps == 0 and final.eval is not None and final.eval.greedy
        assert final.eval.max_prompts >= len(testbed5.addition_rows()[1]) and final.name.endswith("-final")
    cut = testbed5.study_specs(Decisions(96, 0.1, 1e-5, testbed5.CUT))
    assert len(cut) == 10 and {s["steps"] for s in cut} == {80} and {s["seed"] for s in cut} == set(range(5))
    assert [s["name"] for s in testbed5.study_specs(DECIDED, [3])] == ["tb5-grpo-s3", "tb5-cp-grpo-s3"]
    with pytest.raises(ValueError, match="--seeds 5: not in the study's seeds"):
        testbed5.study_specs(Decisions(96, 0.1, 1e-5, testbed5.CUT), [5])
    files = testbed5.write_data()
    base = JobSpec.parse(testbed5.pilot_sampling_spec(files))
    assert base.steps == 0 and base.sampling.max_new_tokens == 256 and base.eval is not None
    assert base.eval.samples_per_prompt == 8 and base.eval.max_prompts == 64 and base.seed == 100
    lr_run = JobSpec.parse(testbed5.pilot_lr_spec(1e-5, 128, files))
    assert lr_run.steps == 40 and lr_run.objective.name == "cp_grpo" and lr_run.seed == 100


def test_study_specs_are_refused_until_the_pilot_has_recorded_its_three_decisions(tmp_path):
    with pytest.raises(testbed5.NoPilotDecision, match="python -m experiments testbed5 pilot"):
        testbed5.load_decisions(tmp_path)
    stats_ok = CapStats(96, 0.3, 0.5, 0.35, 0.0, 0.2)
    testbed5.write_decision(testbed5.decide_cap([stats_ok]), tmp_path, testbed5.CAP_FILE)
    trials = [LrTrial(1e-5, 0.3, 0.0, 0.2), LrTrial(3e-5, 0.3, 0.0, 0.2)]
    testbed5.write_decision(testbed5.decide_lr(trials), tmp_path, testbed5.LR_FILE)
    with pytest.raises(testbed5.NoPilotDecision, match="pilot_budget.json missing"):
        testbed5.load_decisions(tmp_path)
    testbed5.write_decision(testbed5.decide_budget(20, 120, 60, 100, 60), tmp_path, testbed5.BUDGET_FILE)
    assert testbed5.load_decisions(tmp_path) == Decisions(96, 0.3, 3e-5, testbed5.CUT)
    # a pilot that found no cap: the study stays refused, naming the plan's rule
    failed = CapStats(96, 0.9, 0.1, 0.35, 0.0, 0.2)
    testbed5.write_decision(testbed5.decide_cap([failed]), tmp_path, testbed5.CAP_FILE)
    with pytest.raises(testbed5.NoPilotDecision, match="no candidate cap passed"):
        testbed5.load_decisions(tmp_path)
    recorded = json.loads((tmp_path / testbed5.CAP_FILE).read_text())
    assert recorded["date"].endswith("Z") and recorded["stats"][0]["cap"] == 96  # dated, with its numbers


def test_cap_statistics_of_cut_responses():
    samples = [
        # group a: two right (lengths 10, 20), two wrong (one cut at the cap, 40; one 30): mixed
        CutSample("a", 10, False, True),
        CutSample("a", 20, False, True),
        CutSample("a", 40, True, False),
        CutSample("a", 30, False, False),
        # group b: one cut response the verifier still accepts (so b is mixed too), three wrong
        CutSample("b", 40, True, True),
        CutSample("b", 40, True, False),
        CutSample("b", 5, False, False),
        CutSample("b", 5, False, False),
    ]
    s = testbed5.cap_stats(40, samples)
    assert s.accuracy == 3 / 8 and s.mixed_frac == 1.0 and s.truncated_frac == 3 / 8
    assert s.cut_accepted_frac == 1 / 3
    wrong_b = (40 + 5 + 5) / 3
    assert s.residual == pytest.approx(((35 - 15) / (35 + 15) + (40 - wrong_b) / (40 + wrong_b)) / 2)
    assert math.isnan(testbed5.cap_stats(40, [CutSample("a", 3, False, True)]).residual)


@pytest.mark.parametrize(
    ("stats_", "failing"),
    [
        (CapStats(80, 0.05, 0.5, 0.35, 0.0, 0.2), "accuracy"),
        (CapStats(80, 0.65, 0.5, 0.35, 0.0, 0.2), "accuracy"),
        (CapStats(80, 0.3, 0.29, 0.35, 0.0, 0.2), "mixed"),
        (CapStats(80, 0.3, 0.5, 0.35, 0.0, 0.14), "residual"),
        (CapStats(80, 0.3, 0.5, 0.35, 0.0, math.nan), "residual"),
        (CapStats(80, 0.3, 0.5, 0.24, 0.0, 0.2), "truncation"),
        (CapStats(80, 0.3, 0.5, 0.51, 0.0, 0.2), "truncation"),
    ],
)
def test_each_cap_gate_alone_refuses_a_cap(stats_, failing):
    assert [g for g, ok in stats_.gates().items() if not ok] == [failing]
    assert testbed5.decide_cap([stats_]).cap is None


def test_the_cap_passing_every_gate_closest_to_35_percent_truncation_is_chosen():
    caps = [
        CapStats(64, 0.2, 0.5, 0.48, 0.0, 0.3),
        CapStats(96, 0.3, 0.5, 0.30, 0.0, 0.2),  # 0.05 from the target, passes
        CapStats(112, 0.35, 0.5, 0.37, 0.0, 0.1),  # closer but its residual fails
        CapStats(128, 0.4, 0.5, 0.40, 0.0, 0.2),  # 0.05 from the target too: the smaller cap wins the tie
    ]
    decision = testbed5.decide_cap(caps, date="2026-12-01T00:00:00Z")
    assert decision.cap == 96 and decision.base_accuracy == 0.3 and decision.date.startswith("2026-12-01")


def test_learning_rate_rule_takes_the_higher_passing_rate_then_falls_back_to_3e_6():
    """The rule as amended on 2026-11-28: entropy >= 0.1 and the length gap >= 15% of the mean length at step
    30; the cut-off share is recorded but gates nothing (the lr runs' responses shrank below the cap)."""
    both = testbed5.decide_lr([LrTrial(1e-5, 0.5, 0.3, 0.3), LrTrial(3e-5, 0.2, 0.15, 0.2)])
    assert both.lr == 3e-5 and both.next_lr is None
    low = testbed5.decide_lr([LrTrial(1e-5, 0.5, 0.3, 0.3), LrTrial(3e-5, 0.09, 0.15, 0.3)])  # entropy gone
    assert low.lr == 1e-5
    closed = [LrTrial(1e-5, 0.5, 0.3, 0.3), LrTrial(3e-5, 0.5, 0.3, 0.14)]  # the gap closed at 3e-5
    assert testbed5.decide_lr(closed).lr == 1e-5
    uncut = [LrTrial(1e-5, 0.5, 0.0, 0.3), LrTrial(3e-5, 0.5, 0.0, 0.2)]  # no cut-offs: no longer a gate
    assert testbed5.decide_lr(uncut).lr == 3e-5
    none = testbed5.decide_lr([LrTrial(1e-5, 0.05, 0.3, 0.3), LrTrial(3e-5, 0.5, 0.3, 0.02)])
    assert none.lr is None and none.next_lr == 3e-6
    rescued = testbed5.decide_lr([*none.trials, LrTrial(3e-6, 0.4, 0.0, 0.18)])
    assert rescued.lr == 3e-6
    failed = testbed5.decide_lr([*none.trials, LrTrial(3e-6, 0.4, 0.3, 0.1)])
    assert failed.lr is None and failed.next_lr is None  # no study run starts
    with pytest.raises(ValueError, match="needs runs at 1e-05, 3e-05"):
        testbed5.decide_lr([LrTrial(1e-5, 0.5, 0.3, 0.3)])
    metrics = [
        {
            "step": s,
            "diag/d7_entropy_mean": float(s),
            "response/truncated_frac": 0.2,
            "response/length_mean": 40.0 + (s % 2) * 20,  # steps 26-30: 40, 60, 40, 60, 40 (mean 48)
            "diag/d11_len_neg_mean": 30.0,
            # the gap alternates sign (-5 on even steps, +10 on odd) and step 28 has no positive-advantage response
            "diag/d11_len_pos_mean": None if s == 28 else (20.0 if s % 2 else 35.0),
        }
        for s in range(41)
    ]
    trial = testbed5.lr_trial(1e-5, metrics)
    assert trial.entropy == 28.0 and trial.truncated_frac == pytest.approx(0.2)  # the mean of steps 26-30
    # |gap| over the steps with both kinds (26, 27, 29, 30: 5, 10, 10, 5) over the mean length of all five steps
    assert trial.length_gap == pytest.approx(7.5 / 48)


def test_budget_rule_cuts_the_study_when_twelve_full_runs_exceed_ten_hours():
    # one run: 100 x 20 s + 11 evaluations x 120 s + 8 probes x 60 s + final 180 s + 2 start-ups x 60 s
    budget = testbed5.decide_budget(20, 120, 60, 180, 60)
    assert (
        budget.full_hours == pytest.approx(12 * 4100 / 3600) and budget.cut and budget.design == testbed5.CUT
    )
    # 12 runs of exactly 3000 s are 10 h: not over the budget
    quick = testbed5.decide_budget(18.0, 60, 40, 200, 10)  # 1800 + 660 + 320 + 200 + 20 s
    assert quick.full_hours == pytest.approx(10.0) and not quick.cut and quick.design == testbed5.FULL


def test_cut_samples_keep_the_first_tokens_and_rescore_them(tmp_path):
    class Chars:  # a tokenizer of one token per character
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

        def decode(self, ids):
            return "".join(map(chr, ids))

    row = next(r for r in testbed5.addition_rows(99)[0] if r["id"] == "add-75-58")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    items = testbed5.dataset_items(path)
    text = "70 + 50 = 120, 5 + 8 = 13. Answer: 133"
    samples = [{"row": "add-75-58", "tokens": len(text) + 1, "response": text}]  # + the end-of-turn token
    assert testbed5.cut_samples(samples, 40, items, Chars()) == [CutSample("add-75-58", 39, False, True)]
    # cut after "70 + 50 = 120, 5 + 8": its last number is 8
    assert testbed5.cut_samples(samples, 20, items, Chars()) == [CutSample("add-75-58", 20, True, False)]


# ---------------------------------------------------------------- the report on synthetic runs


def _run(objective, seed, d2=None, start=None, gap=None):
    grpo = objective == "grpo"
    d2 = (0.1 if grpo else 0.0) if d2 is None else d2
    start = (30 if grpo else 20) + seed if start is None else start
    gap = (20 if grpo else 10) + seed if gap is None else gap
    metrics = []
    for s in range(101):
        m = {"step": s}
        if s:
            m |= {
                "reward/accuracy": 0.55 if s >= start else 0.1,
                "diag/d2_residual": d2,
                "diag/d11_len_neg_mean": 40.0 + gap if s > 20 else 45.0,
                "diag/d11_len_pos_mean": 40.0 if s > 20 else 45.0 - (5 if s % 2 else 0),
                "response/length_mean": 50.0,
                "diag/d7_entropy_shared": 0.3 - (0.1 if grpo else 0.0) + seed / 100,
            }
        if s % 10 == 0:
            m |= {"eval/accuracy": 0.2, "eval/greedy/accuracy": 0.2 + s / 500 + (0 if grpo else 0.05)}
        metrics.append(m)
    probes = {s: {"probe/kl_from_start": s / 1000 * (2 if grpo else 1)} for s in testbed5.FULL.named_evals}
    final = {"eval/accuracy": 0.4 + seed / 100}
    name = testbed5.run_name(objective, seed)
    return {
        **testbed5.summarise_run(metrics, probes, final),
        "name": name,
        "objective": objective,
        "seed": seed,
        "cap": 128,
    }


def _study(tmp_path, runs):
    runs_dir, decisions = tmp_path / "runs", tmp_path / "decisions"
    runs_dir.mkdir(parents=True, exist_ok=True)
    for r in runs:
        (runs_dir / f"{r['name']}.json").write_text(json.dumps(r))
    testbed5.write_decision(
        testbed5.decide_cap([CapStats(128, 0.1, 0.5, 0.35, 0.0, 0.2)]), decisions, testbed5.CAP_FILE
    )
    testbed5.write_decision(
        testbed5.decide_lr([LrTrial(1e-5, 0.5, 0.0, 0.3), LrTrial(3e-5, 0.5, 0.0, 0.3)]),
        decisions,
        testbed5.LR_FILE,
    )
    testbed5.write_decision(testbed5.decide_budget(1, 1, 1, 1, 1), decisions, testbed5.BUDGET_FILE)
    return runs_dir, decisions


def test_endpoints_recompute_from_the_summaries_as_the_plan_defines_them(tmp_path):
    runs_dir, _ = _study(tmp_path, [_run(o, s) for s in range(6) for o in ("grpo", "cp_grpo")])
    runs = testbed5_report.load_runs(runs_dir)
    g0, c0 = runs["grpo"][0], runs["cp_grpo"][0]
    assert testbed5_report.primary(g0) == 20.0 and testbed5_report.primary(c0) == 10.0  # steps 21-100 only
    # the 10-step mean of 0.1s and 0.55s first reaches 0.1 + 0.2 with five 0.55s: start + 4
    assert testbed5_report.steps_to_gain(g0, 0.1) == 34 and testbed5_report.steps_to_gain(c0, 0.1) == 24
    assert testbed5_report.steps_to_gain(g0, 0.5) == 101  # never: the last step + 1
    assert testbed5_report.late_accuracy(g0) == pytest.approx((0.2 + 60 / 500 + 0.2 + 80 / 500 + 0.4) / 3)
    assert testbed5_report.shared_entropy(g0) == pytest.approx(0.2)
    assert testbed5_report.learning_tax(g0) == pytest.approx(0.2 / 0.2)  # KL 0.2, gain 100 / 500
    assert testbed5_report.early_gap_share(g0) == pytest.approx(
        (20 * 30 + 5 * 10) / 50 / 50
    )  # |gap| over steps 1-50: 20 on 21-50, 5 on the odd steps before
    results = testbed5_report.analyse(runs, 0.1)
    primary = results[0]
    assert primary.grpo == tuple(20.0 + s for s in range(6)) and primary.paired == (10.0,) * 6
    assert primary.comparison == stats.compare(primary.grpo, primary.cp)
    assert primary.comparison.p_value == pytest.approx(2 / 924) and primary.significant
    assert [r.holm_p for r in results[1:]] == stats.holm([r.comparison.p_value for r in results[1:]])
    s1 = results[1]
    assert s1.comparison.diff == 10.0 and s1.significant  # cp_grpo reaches the gain 10 steps sooner
    check = testbed5_report.manipulation_check(runs, 6)
    assert check.holds and check.grpo_passing == 6 and check.cp_max_d2 == 0.0


def test_manipulation_check_fails_on_each_of_its_three_conditions(tmp_path):
    def check(runs):
        runs_dir, _ = _study(tmp_path / str(len(list(tmp_path.iterdir()))), runs)
        return testbed5_report.manipulation_check(testbed5_report.load_runs(runs_dir), 6)

    base = [_run(o, s) for s in range(6) for o in ("grpo", "cp_grpo")]
    assert check(base).holds
    weak = [_run("grpo", s, d2=0.04 if s < 2 else 0.1) for s in range(6)] + base[1::2]  # 4 of 6 seeds
    assert check(weak).grpo_passing == 4 and not check(weak).holds
    one_weak = [_run("grpo", s, d2=0.04 if s < 1 else 0.1) for s in range(6)] + base[1::2]
    assert check(one_weak).holds  # 5 of 6 is enough
    leaky = base[::2] + [_run("cp_grpo", s, d2=2e-4 if s == 3 else 0.0) for s in range(6)]
    assert not check(leaky).holds
    closed = base[::2] + [_run("cp_grpo", s, gap=0.0) for s in range(6)]  # gap 5 on odd early steps only
    assert check(closed).gap_share["cp_grpo"] < 0.15 and not check(closed).holds
    assert not check(base[:10]).holds  # a part-done study cannot pass


def test_report_section_is_not_yet_run_then_leads_with_the_manipulation_check(tmp_path):
    empty = testbed5_report.section(tmp_path / "none", tmp_path / "none")
    assert "**Not yet run**" in "\n".join(empty) and "python -m experiments testbed5 pilot" in "\n".join(
        empty
    )
    runs_dir, decisions = _study(tmp_path, [_run(o, s) for s in range(6) for o in ("grpo", "cp_grpo")])
    assert "no study run has finished yet" in "\n".join(testbed5_report.section(tmp_path / "x", decisions))
    text = "\n".join(testbed5_report.section(runs_dir, decisions))
    assert text.index("**Manipulation check**") < text.index("| Length gap (primary)")
    assert "in 6 of 6 seeds" in text and "It holds" in text and "Runs finished: 12 of 12" in text
    primary_row = next(ln for ln in text.splitlines() if ln.startswith("| Length gap (primary)"))
    assert "grpo > cp_grpo: the mechanism reaches behaviour" in primary_row
    s3_row = next(ln for ln in text.splitlines() if ln.startswith("| S3"))
    assert "passes, the paper's direction" in s3_row  # grpo lower by 0.1 in every seed
    assert "no effect" not in text.replace("never 'no effect'", "")
    assert text.index("**Exploratory** (no verdicts)") > text.index("| S4")
    assert "paired sign-flip test: p=0.0312" in text  # 6 seeds, all +10: 2 of 64 sign patterns
    dose = next(ln for ln in text.splitlines() if ln.startswith("| 0 |"))
    assert dose.startswith("| 0 | 10 | 10 | 10 |")  # grpo's D2 0.1 x 100 steps; primary +10; S1 +10 steps
    # one run a side: differences, no p-values (a one-against-one permutation test is p = 1 whatever it says)
    one_each, _ = _study(tmp_path / "one", [_run("grpo", 0), _run("cp_grpo", 0)])
    text = "\n".join(testbed5_report.section(one_each, decisions))
    for row in (ln for ln in text.splitlines() if ln.startswith("| S")):
        assert row.split(" | ")[5] == "-" and "not enough runs to test yet" in row, row
    assert "paired sign-flip test: p=n/a (1 paired seeds)" in text


def test_sign_flip_test_is_exact_over_every_sign_pattern():
    assert testbed5_report.sign_flip_p([1.0] * 6) == 2 / 64
    assert testbed5_report.sign_flip_p([1.0, -1.0]) == 1.0
    assert testbed5_report.sign_flip_p([3.0, 1.0, 1.0]) == 2 / 8  # only all-same signs reach |mean| 5/3
    assert math.isnan(testbed5_report.sign_flip_p([]))


def test_a_killed_run_resumes_then_gets_its_final_evaluation_probes_and_summary(tmp_path, monkeypatch):
    """The study's flow with the trainer replaced: the first job dies at step 30, the rerun resumes from the
    newest checkpoint, the final checkpoint is evaluated by an eval-only job, the named steps are probed
    before the checkpoints go."""
    import ray

    import tgc_rl.trainer.main
    from tgc_rl.run_layout import METRICS_FILE, TRAINER_STATE_FILE, checkpoint_name

    jobs: list[tuple[str, int, str | None]] = []

    def write_steps(run_dir, first, last):
        with open(run_dir / METRICS_FILE, "a") as fh:
            for s in range(first, last + 1):
                m = {"step": s}
                if s:
                    m |= {"reward/accuracy": 0.5, "diag/d2_residual": 0.0, "diag/d7_entropy_shared": 0.2}
                    m |= {"timing/step_s": 2.0}
                if s % 10 == 0:
                    m |= {"eval/accuracy": 0.3, "eval/greedy/accuracy": 0.4, "timing/eval_s": 5.0}
                    (run_dir / "eval").mkdir(exist_ok=True)
                    sample = {"row": "add-1-2", "mode": "sampled", "response": "Answer: 3"}
                    (run_dir / "eval" / f"step_{s}.jsonl").write_text(json.dumps(sample) + "\n")
                    if s:
                        ckpt = run_dir / "checkpoints" / checkpoint_name(s)
                        (ckpt / "model").mkdir(parents=True)
                        (ckpt / TRAINER_STATE_FILE).write_text("{}")
                fh.write(json.dumps(m) + "\n")

    def train(spec, run_dir, resume=None, progress=True):
        run_dir.mkdir(parents=True, exist_ok=True)
        jobs.append((spec.name, spec.steps, None if resume is None else str(resume)))
        if spec.steps == 0:  # the final evaluation
            (run_dir / METRICS_FILE).write_text(json.dumps({"step": 0, "eval/accuracy": 0.45}) + "\n")
            (run_dir / "eval").mkdir()
            (run_dir / "eval" / "step_0.jsonl").write_text("{}\n")
            return "succeeded"
        if resume is None:
            write_steps(run_dir, 0, 30)
            return "failed"  # killed after its step-30 checkpoint
        write_steps(run_dir, 31, spec.steps)
        return "succeeded"

    class Prober:
        tok = staticmethod(lambda text, add_special_tokens=False: {"input_ids": text.split()})

        def probe(self, path, samples):
            assert path.exists() and samples  # probed before the checkpoints are deleted
            step = 0 if path.name == "base" else int(path.parent.name.split("_")[-1])
            return {"probe/kl_from_start": step / 1000}

    monkeypatch.setattr(tgc_rl.trainer.main, "run", train)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no cluster: the trainer is replaced above
    monkeypatch.setattr(testbed5, "make_prober", lambda: Prober())
    (tmp_path / "base").mkdir()
    monkeypatch.setattr(testbed5, "base_model_path", lambda: tmp_path / "base")
    args = dict(seeds=[0], out=tmp_path / "runs", cache=tmp_path / "cache", log=lambda _: None)
    decided = Decisions(128, 0.1, 3e-5, testbed5.FULL)
    written = testbed5.run_study(**args, decisions=decided)
    # grpo s0 died; cp_grpo s0 died too (the same fake): nothing written, checkpoints kept for the rerun
    assert written == [] and [j[2] for j in jobs] == [None, None]
    run_dir = tmp_path / "cache" / "testbed5" / "tb5-grpo-s0"
    assert (run_dir / "checkpoints" / checkpoint_name(30)).exists()
    jobs.clear()
    written = testbed5.run_study(**args, decisions=decided)
    assert [(n, s, r is not None) for n, s, r in jobs[:2]] == [
        ("tb5-grpo-s0", 100, True),
        ("tb5-grpo-s0-final", 0, True),
    ]
    assert jobs[0][2] == "latest" and jobs[1][2] == str(run_dir / "checkpoints" / checkpoint_name(100))
    summary = json.loads(written[0].read_text())
    assert summary["steps"] == list(range(1, 101)) and summary["final_eval"]["eval/accuracy"] == 0.45
    # both sessions' steps and evaluations count, not only the resumed process's
    assert summary["resumed_from_step"] == 30 and summary["train_seconds"] == 100 * 2.0 + 11 * 5.0
    probed = {int(s) for s, e in summary["evals"].items() if "probe/kl_from_start" in e}
    assert probed == set(testbed5.FULL.named_evals) and len(summary["evals"]) == 11
    assert summary["evals"]["100"]["probe/kl_from_start"] == 0.1 and summary["cap"] == 128
    assert all(e["opening/top_share"] == 1.0 for e in summary["evals"].values())  # every evaluation
    assert not (run_dir / "checkpoints").exists()
    run = testbed5_report.Run.from_json(summary)  # what the report reads
    assert run.last_step == 100 and run.final_accuracy == 0.45
    jobs.clear()
    assert testbed5.run_study(**args, decisions=decided) == [] and jobs == []  # finished runs are skipped


def test_opening_share_counts_the_most_common_first_four_tokens_of_sampled_answers():
    def words(text, add_special_tokens=False):
        return {"input_ids": text.split()}

    samples = [
        {"mode": "sampled", "response": "To add 3 and 4, add the ones. Answer: 7"},
        {"mode": "sampled", "response": "To add 3 and 4: Answer: 7"},
        {"mode": "sampled", "response": "3 + 4 = 7. Answer: 7"},
        {"mode": "greedy", "response": "3 + 4 = 7. Answer: 7"},  # greedy answers are not counted
    ]
    assert testbed5.opening_share(samples, words) == 2 / 3
    assert math.isnan(testbed5.opening_share(samples[3:], words))


def test_a_pilot_job_is_reused_only_on_the_inputs_it_ran_on(tmp_path, monkeypatch):
    """A finished pilot run is not run again, on this machine or (from its record in results) on another, but an
    amended data file (same path, new content) or a killed attempt reruns it from a clean directory: no stale
    samples or steps reach a decision."""
    from tgc_rl.run_layout import METRICS_FILE

    files = testbed5.DataFiles(tmp_path / "train.jsonl", tmp_path / "heldout.jsonl", tmp_path / "pilot.jsonl")
    for path in (files.train, files.heldout, files.pilot):
        path.write_text('{"id": "add-1-2"}\n')
    jobs: list[str] = []

    def fake_train(spec, run_dir, resume):
        jobs.append(spec["name"])
        run_dir.mkdir(parents=True, exist_ok=True)
        entropy = 0.5 if len(jobs) == 1 else 0.2
        with open(run_dir / METRICS_FILE, "a") as fh:  # the trainer appends: a stale row would survive
            for s in range(1, testbed5.LR_STEPS + 1):
                row = {
                    "step": s,
                    "diag/d7_entropy_mean": entropy,
                    "response/truncated_frac": 0.3,
                    "response/length_mean": 40.0,
                    "diag/d11_len_neg_mean": 50.0,
                    "diag/d11_len_pos_mean": 30.0,
                }
                fh.write(json.dumps(row | ({"stale": 1.0} if len(jobs) == 1 else {})) + "\n")
        return "succeeded"

    class Heavy:
        def run(self, label, work):
            return work()

    monkeypatch.setattr(testbed5, "_train", fake_train)
    ctx = testbed5._PilotContext(files, tmp_path, tmp_path / "cache", Heavy(), False, lambda _: None)
    first = testbed5._pilot_lr_run(ctx, 1e-5, 96).trial
    assert (len(jobs), first.entropy) == (1, 0.5)
    assert testbed5._pilot_lr_run(ctx, 1e-5, 96).trial == first and len(jobs) == 1
    # a later session's machine: no run directories, the record in results holds the run
    ctx.cache = tmp_path / "another-machine"
    again = testbed5._pilot_lr_run(ctx, 1e-5, 96)
    assert again.trial == first and len(jobs) == 1 and len(again.metrics) == testbed5.LR_STEPS
    (record,) = ctx.written
    assert record == tmp_path / testbed5.PILOT_RUNS / f"{testbed5.pilot_lr_name(1e-5)}.json"
    # back on the first machine, whose run directory holds the first job's rows
    ctx.cache = tmp_path / "cache"
    files.train.write_text('{"id": "add-2-2"}\n')  # an amendment rewrites the file under the same path
    again = testbed5._pilot_lr_run(ctx, 1e-5, 96)
    assert (len(jobs), again.trial.entropy) == (2, 0.2)
    assert not any("stale" in m for m in again.metrics)
    assert json.loads(record.read_text())["metrics"] == again.metrics  # the record follows the rerun


def test_report_says_where_the_pilot_stopped_when_no_cap_passes(tmp_path):
    stats = [CapStats(c, 0.002, 0.016, 0.4, 0.0, 0.03) for c in (96, 112)]
    testbed5.write_decision(testbed5.decide_cap(stats), tmp_path, testbed5.CAP_FILE)
    text = "\n".join(testbed5_report.section(tmp_path / "none", tmp_path))
    assert "**Not yet run**" in text and "has not recorded" not in text
    assert "no response cap passing the four gates" in text and "base accuracy at most 0.002" in text
    assert "caps 96, 112" in text and "amended (dated)" in text


def test_the_wording_probe_samples_each_wording_as_step_1_does_and_measures_each_apart(tmp_path, monkeypatch):
    """Exploratory probe: one eval-only job for all wordings (step 1's sampling settings), each wording's
    samples cut and scored on their own; a finished job on the same inputs is not run again."""
    import ray

    import tgc_rl.models

    class Chars:  # one token per character
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

        def decode(self, ids):
            return "".join(map(chr, ids))

    jobs = []

    def fake_train(spec, run_dir, resume):
        jobs.append(spec)
        rows = testbed5.read_rows(Path(spec["eval"]["dataset"]["path"]))[: spec["eval"]["max_prompts"]]
        samples = []
        for r in rows:
            right = f"{r['a']} + {r['b']} = {r['sum']}. Answer: {r['sum']}"
            for i in range(spec["eval"]["samples_per_prompt"]):
                # "good": half right and short, half rambling past every cap; "bad": every one rambling
                text = right if r["id"].startswith("good/") and i % 2 == 0 else "so " * 100
                samples.append({"row": r["id"], "mode": "sampled", "tokens": len(text) + 1, "response": text})
        (run_dir / "eval").mkdir(parents=True)
        (run_dir / "eval" / "step_0.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        return "succeeded"

    monkeypatch.setattr(testbed5, "_train", fake_train)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no cluster: the trainer is replaced above
    monkeypatch.setattr(tgc_rl.models, "load_tokenizer", lambda spec: Chars())
    wordings = (
        testbed5.Wording("good", "What is {a} + {b}? End with 'Answer: <number>'.", 99),
        testbed5.Wording("bad", "Add {a} and {b}.", 49),
    )
    args = dict(wordings=wordings, cache=tmp_path / "cache", folder=tmp_path, log=lambda _: None)
    path = testbed5.run_probe(2, **args)
    assert path.name == "probe_wordings_2.json"
    record = json.loads(path.read_text())
    (spec,) = jobs
    assert spec["steps"] == 0 and spec["sampling"] == {"temperature": 0.7, "max_new_tokens": 256}
    assert (
        spec["eval"]["samples_per_prompt"] == 8 and spec["eval"]["max_prompts"] == 2 * testbed5.PROBE_PROMPTS
    )
    prompts = testbed5.read_rows(Path(spec["eval"]["dataset"]["path"]))
    assert max(max(r["a"], r["b"]) for r in prompts if r["id"].startswith("bad/")) <= 49
    assert prompts[0]["prompt"] == wordings[0].template.format(a=prompts[0]["a"], b=prompts[0]["b"])
    assert spec["name"] == "tb5-probe-wordings-2" and record["round"] == 2
    assert "exploratory" in record and [w["name"] for w in record["wordings"]] == ["good", "bad"]
    good, bad = (w["decision"] for w in record["wordings"])
    assert all(w["samples"] == testbed5.PROBE_PROMPTS * 8 for w in record["wordings"])
    assert [(s["accuracy"], s["mixed_frac"], s["truncated_frac"]) for s in good["stats"]] == [
        (0.5, 1.0, 0.5)
    ] * len(testbed5.CANDIDATE_CAPS)
    assert good["cap"] == 48 and good["stats"][0]["residual"] > 0.15  # passes every gate: the smallest cap
    assert bad["cap"] is None and all(s["accuracy"] == 0.0 for s in bad["stats"])
    testbed5.run_probe(2, **args)
    assert len(jobs) == 1  # reused: the same spec and prompts
