"""Testbed 4's pure parts: the data split, job specs, prefix-tree position kinds, phrasing drift, and the
per-run summary (the training itself is the trainer's, tested under tests/trainer)."""

import json
import math

import numpy as np
import pytest

from experiments import testbed4
from tgc_rl.config import JobSpec


def test_held_out_pairs_are_held_out_in_both_orders_and_the_split_is_fixed():
    train, held = testbed4.addition_rows()
    assert len(train) + len(held) == (testbed4.MAX_OPERAND + 1) ** 2
    held_pairs = {frozenset((r["a"], r["b"])) for r in held}
    assert len(held_pairs) == testbed4.HELDOUT_PAIRS
    assert not held_pairs & {frozenset((r["a"], r["b"])) for r in train}
    assert {(r["b"], r["a"]) for r in held} == {(r["a"], r["b"]) for r in held}  # both orders
    assert all(r["answer"] == str(r["a"] + r["b"]) for r in train + held)
    assert testbed4.addition_rows() == (train, held)


def test_every_planned_run_is_a_valid_job_spec_with_a_sampled_and_greedy_evaluation():
    for objective in testbed4.OBJECTIVES:
        spec = JobSpec.parse(testbed4.job_spec(objective, 2))
        assert spec.steps == 150 and spec.seed == 2 and spec.eval is not None
        assert spec.eval.samples_per_prompt == 8 and spec.eval.also_greedy and not spec.eval.greedy
        assert spec.checkpoint.every_steps == spec.eval.every_steps == 25 and spec.checkpoint.keep_last == 7
    assert testbed4.run_name("cp_grpo", 1) == "tb4-cp-grpo-s1"
    assert testbed4.run_name("cp_grpo", 1, 1e-4, 40) == "tb4-cp-grpo-s1-lr0.0001-n40"


def test_select_is_seed_major_and_refuses_unknown_objectives():
    runs = testbed4.select(["grpo", "cp_grpo"], [0, 1])
    assert runs == [
        ("grpo", 0, None, None),
        ("cp_grpo", 0, None, None),
        ("grpo", 1, None, None),
        ("cp_grpo", 1, None, None),
    ]
    with pytest.raises(ValueError, match="unknown nope"):
        testbed4.select(["nope"])


def test_position_kinds_mark_shared_prefix_tokens_and_forks():
    answers = [[1, 2, 3], [1, 2, 4, 5], [1, 7], [9]]
    kinds = testbed4.position_kinds(answers)
    assert kinds[0] == ["shared", "shared", "fork"]  # 1,2 shared with answer 1; 3 leaves it
    assert kinds[1] == ["shared", "shared", "fork", ""]  # after the fork nobody shares the prefix
    assert kinds[2] == ["shared", "fork"]
    assert kinds[3] == ["fork"]  # the empty prefix is shared by all: a first token no one else chose
    assert testbed4.position_kinds([[5, 6], [5, 6]]) == [["shared", "shared"], ["shared", "shared"]]


def test_position_kinds_agree_with_the_learners_per_step_d7_on_random_groups():
    """The probe's labels and rlcore's D7 shared-node / fork entropies are one definition, computed twice."""
    import torch

    from rlcore.diagnostics import cancellation_diagnostics

    rng = np.random.default_rng(0)
    for _ in range(20):
        # a vocabulary of 3: many shared nodes and forks
        answers = [list(rng.integers(0, 3, rng.integers(1, 6))) for _ in range(6)]
        width = max(map(len, answers))
        ids = torch.zeros(6, width, dtype=torch.long)
        mask = torch.zeros(6, width, dtype=torch.bool)
        for i, a in enumerate(answers):
            ids[i, : len(a)], mask[i, : len(a)] = torch.tensor(a), True
        ent = torch.tensor(rng.random((6, width)))
        w, one_group, adv = (
            torch.zeros(6, width, dtype=torch.float64),
            torch.zeros(6, dtype=torch.long),
            torch.zeros(6),
        )
        d = cancellation_diagnostics(w, ids, mask, one_group, adv, entropies=ent)
        labels = testbed4.position_kinds(answers)
        for kind, count in (("shared", "shared_tokens"), ("fork", "fork_rows")):
            picked = [
                ent[i, t].item() for i, row in enumerate(labels) for t, k in enumerate(row) if k == kind
            ]
            assert d[f"diag/d7_{count}"] == len(picked)
            assert d[f"diag/d7_entropy_{kind}"] == pytest.approx(np.mean(picked) if picked else 0.0)


def test_phrase_metrics_see_a_shift_between_equivalent_answers_but_not_a_uniform_gain():
    base = np.log(np.full((3, 4), 0.25))
    same_split = base + 1.0  # every form more likely by the same factor: no drift, more mass
    m = testbed4.phrase_metrics(same_split, base)
    assert m["phrase/kl_from_start"] == pytest.approx(0.0, abs=1e-12)
    assert m["phrase/entropy"] == pytest.approx(math.log(4))
    assert m["phrase/log_mass"] == pytest.approx(1.0)
    shifted = np.log(np.tile([0.7, 0.1, 0.1, 0.1], (3, 1)))
    m = testbed4.phrase_metrics(shifted, base)
    assert m["phrase/kl_from_start"] == pytest.approx(0.7 * math.log(2.8) + 0.3 * math.log(0.4))
    assert m["phrase/top_share"] == pytest.approx(0.7) and m["phrase/share_0"] == pytest.approx(0.7)


def test_summary_has_curves_evaluations_with_probes_and_steps_to_the_threshold():
    metrics = [{"step": 0, "eval/accuracy": 0.2, "eval/pass@8": 0.5}]
    metrics += [
        {"step": s, "reward/accuracy": 0.3 if s < 20 else 0.6, "diag/d2_residual": 1e-9} for s in range(1, 41)
    ]
    metrics[-1]["eval/accuracy"] = 0.55
    probes = {0: {"probe/kl_from_start": 0.0}, 40: {"probe/kl_from_start": 0.02}}
    summary = testbed4.summarise_run(metrics, probes)
    assert summary["steps"] == list(range(1, 41)) and len(summary["curves"]["reward/accuracy"]) == 40
    assert (
        summary["evals"]["0"]["eval/pass@8"] == 0.5 and summary["evals"]["40"]["probe/kl_from_start"] == 0.02
    )
    assert math.isnan(summary["evals"]["0"]["eval/greedy/accuracy"])  # not logged: NaN, not 0
    # the 10-step mean first reaches 0.5 on step 26 (seven of ten at 0.6: 0.51; on step 25, 0.48)
    assert summary["final"]["steps_to_threshold"] == 26
    assert summary["final"]["d2_residual_mean"] == pytest.approx(1e-9)


def _fake_run(objective, seed, drift):
    rng = np.random.default_rng(seed)
    metrics = [{"step": 0, "eval/accuracy": 0.2, "eval/greedy/accuracy": 0.3, "eval/pass@8": 0.6}]
    for s in range(1, 51):
        metrics.append(
            {"step": s, "reward/accuracy": min(1.0, 0.2 + s / 60), "diag/d2_residual": drift * 0.1}
        )
    metrics[-1].update(
        {"eval/accuracy": 0.5, "eval/greedy/accuracy": 0.6 + rng.normal(0, 0.01), "eval/pass@8": 0.9}
    )
    probes = {
        0: {"phrase/kl_from_start": 0.0, "probe/kl_from_start": 0.0, "entropy/all": 1.0},
        50: {
            "phrase/kl_from_start": drift + rng.normal(0, 0.01),
            "probe/kl_from_start": 0.01,
            "entropy/all": 0.8,
        },
    }
    return {**testbed4.summarise_run(metrics, probes), "name": testbed4.run_name(objective, seed)}


def test_report_section_tabulates_claims_by_class_and_draws_the_curves(tmp_path):
    from experiments import testbed4_report

    runs_dir = tmp_path / "testbed4_runs"
    runs_dir.mkdir()
    arms = {"grpo": 1.0, "grpo_ar": 1.0, "cp_grpo": 0.0, "dfpo_min": 0.0}
    for objective, drift in arms.items():
        for seed in range(3):
            run = {**_fake_run(objective, seed, drift), "objective": objective, "seed": seed}
            (runs_dir / f"{run['name']}.json").write_text(json.dumps(run))
    sweep = {
        **_fake_run("cp_grpo", 0, 0.0),
        "objective": "cp_grpo",
        "seed": 0,
        "name": "tb4-cp-grpo-s0-lr1e-05",
    }
    (runs_dir / "sweep.json").write_text(json.dumps(sweep))  # not a planned run: left out
    twin = {
        **_fake_run("grpo", 0, 1.0),
        "objective": "gspo",
        "seed": 0,
    }  # a dropped arm's run: left out, compared
    twin["name"] = testbed4.run_name("gspo", 0)
    (runs_dir / "gspo.json").write_text(json.dumps(twin))
    lines, cells = testbed4_report.section(runs_dir, tmp_path, tmp_path)
    text = "\n".join(lines)
    assert (tmp_path / testbed4_report.FIGURE).stat().st_size > 10_000
    assert "Runs finished: 12 of the 18 planned" in text and "cp_grpo: seeds 0, 1, 2" in text
    assert "gspo seed 0 against grpo seed 0:" in text and "gspo: seeds" not in text
    assert "With 3 and 3 seeds, grpo against cp_grpo cannot pass a test" in text
    drift_row = next(ln for ln in lines if ln.startswith("| Reward-irrelevant drift"))
    assert drift_row.endswith("| as the paper predicts |")  # coupled arms drift by ~1, exchangeable ~0
    header = next(ln for ln in lines if ln.startswith("| Claim"))
    holm_p = float(drift_row.split(" | ")[header.split(" | ").index("Holm p")])
    assert 2 / 924 < holm_p < 0.05  # 6 vs 6 fully apart: exact p 2 / C(12, 6), adjusted over the claims
    tax_row = next(ln for ln in lines if ln.startswith("| Learning tax"))
    assert tax_row.endswith("| n.s., no difference at all |")  # the same 0.01 everywhere
    assert testbed4_report.section(tmp_path / "none", tmp_path, tmp_path) == ([], {})
    # the report summary's testbed-4 column
    assert cells["C2"] == "reproduced (reward-irrelevant drift)"
    assert cells["C5"] == "n.s., no difference at all (learning tax: 0 (95% CI 0 to 0))"
    assert cells["C12"].startswith("reproduced")  # cp_grpo's D2 0 <= 1e-4 < grpo's 0.1
    assert "C3" not in cells
    assert testbed4_report.verdict(-1.0, 0.01, +1, 6, 12) == "opposite to the paper's prediction"
    assert testbed4_report.verdict(1.0, 0.01, +1, 1, 12) == "not measured yet"
    assert testbed4_report.verdict(1.0, 1.0, +1, 2, 2, family=16) == "too few runs to test (2 vs 2)"
    # not significant: the direction the difference points, never "no effect"
    assert testbed4_report.verdict(1.0, 0.5, +1, 6, 12, family=16) == "n.s., the paper's direction"
    assert testbed4_report.verdict(-1.0, 0.5, +1, 6, 12, family=16) == "n.s., against the paper's direction"
    assert testbed4_report.verdict(1.0, 0.01, +1, 6, 12, by="Dr. GRPO") == "as Dr. GRPO predicts"
    assert "rules out" not in text and "no effect at this scale" not in text


def test_extra_seeds_of_grpo_and_cp_grpo_sharpen_their_pair_and_leave_the_class_test_balanced(tmp_path):
    from experiments import testbed4_report

    runs_dir = tmp_path / "testbed4_runs"
    runs_dir.mkdir()
    seeds = {"grpo": 5, "grpo_ar": 3, "cp_grpo": 5, "dfpo_min": 3}
    for objective, n in seeds.items():
        for seed in range(n):
            drift = (3.0 if seed > 2 else 1.0) if objective in testbed4_report.COUPLED else 0.0
            run = {**_fake_run(objective, seed, drift), "objective": objective, "seed": seed}
            (runs_dir / f"{run['name']}.json").write_text(json.dumps(run))
    lines, _ = testbed4_report.section(runs_dir, tmp_path, tmp_path)
    text = "\n".join(lines)
    assert "Runs finished: 12 of the 18 planned, and 4 extra" in text and "grpo: seeds 0, 1, 2, 3, 4" in text
    header = next(ln for ln in lines if ln.startswith("| Claim")).split(" | ")
    mechanism = next(ln for ln in lines if ln.startswith("| Mechanism")).split(" | ")
    # the class test stays 6 vs 6 (seeds 0-2): fully apart, exact p 2 / C(12, 6) before adjustment
    assert mechanism[header.index("coupled - exchangeable")].endswith(
        "+0.1 (95% CI +0.1 to +0.1), p=0.0022"
    )  # no spread: the difference
    # the pair uses all five seeds a side (p 2/252) and is Holm-adjusted over its five named claims
    pair = mechanism[header.index("grpo - cp_grpo")]
    assert "p=0.0079, Holm p 0.04" in pair
    assert "passes for mechanism: residual on shared tokens." in text
    phase = next(ln for ln in lines if ln.startswith("| grpo |"))  # seeds 0-2 only (3-4 have D2 0.3)
    assert phase.split(" | ")[1] == "0.1 / nan"
    drift = next(ln for ln in lines if ln.startswith("| Reward-irrelevant drift")).split(" | ")
    assert "Holm p" not in drift[header.index("grpo - cp_grpo")]  # outside the pair's family: an effect size


@pytest.mark.slow
def test_probes_of_the_initial_model_read_zero_drift_and_a_changed_model_reads_some(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    # the study's model, with the smallest probe sets that reach every measurement: one phrase prompt (its
    # eight phrasings), one unrelated prompt and an 8-token answer to it (the study: 32, 24 and 32 tokens)
    prober = testbed4.make_prober(phrase_prompts=1, probe_prompts=testbed4.PROBE_PROMPTS[:1], probe_tokens=8)
    base = testbed4.base_model_path()
    same = prober.probe(base, None)
    assert same["phrase/kl_from_start"] == pytest.approx(0.0, abs=1e-9)
    assert same["probe/kl_from_start"] == pytest.approx(0.0, abs=1e-9)
    assert 0 < same["phrase/top_share"] <= 1 and same["phrase/log_mass"] < 0
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():  # a small change of the last layer's MLP: every output moves a little
        model.model.layers[-1].mlp.down_proj.weight.mul_(1.05)
    model.save_pretrained(tmp_path / "changed")
    row = prober.phrase_rows[0]
    samples = [
        {"row": row["id"], "mode": "sampled", "response": text}
        for text in (f"{row['answer']}", f"{row['answer']}.", f"The answer is {row['answer']}.")
    ]
    changed = prober.probe(tmp_path / "changed", samples)
    assert changed["phrase/kl_from_start"] > 1e-6 and changed["probe/kl_from_start"] > 1e-6
    assert changed["entropy/all"] > 0 and changed["entropy/shared"] > 0 and changed["entropy/fork"] > 0


def test_a_failed_run_moves_the_study_on_and_a_cancelled_one_stops_it(tmp_path, monkeypatch):
    import ray

    import tgc_rl.trainer.main

    states = iter(["failed", "cancelled", "succeeded"])
    trained: list[str] = []

    def train(spec, run_dir, resume=None, progress=True):
        trained.append(spec.name)
        return next(states)

    monkeypatch.setattr(tgc_rl.trainer.main, "run", train)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no cluster: training is replaced above
    runs = testbed4.select(objectives=["grpo", "cp_grpo", "dr_grpo"], seeds=[0], steps=2)
    with pytest.raises(SystemExit):
        testbed4.run_study(runs, tmp_path / "runs", tmp_path / "cache", log=lambda _: None)
    assert trained == ["tb4-grpo-s0-n2", "tb4-cp-grpo-s0-n2"]
    assert not list((tmp_path / "runs").iterdir())


def test_late_accuracy_averages_the_last_evaluations_and_the_decline_is_measured_from_the_peak():
    from experiments import testbed4_report

    accuracy = {"0": 0.2, "50": 0.7, "100": 0.6, "125": float("nan"), "150": 0.5}
    run = {"evals": {s: {"eval/greedy/accuracy": v} for s, v in accuracy.items()}}
    assert testbed4_report.late_mean("eval/greedy/accuracy")(run) == pytest.approx(0.55)  # NaN left out
    assert testbed4_report.peak_decline(run) == pytest.approx(0.2)
    assert testbed4_report.worst_drop(run) == pytest.approx(0.1)


def test_phase_table_shows_the_residual_and_the_length_gap_it_feeds_on_per_window():
    from experiments import testbed4_report

    run = {
        "steps": list(range(1, 51)),
        "curves": {
            "diag/d2_residual": [0.1] * 25 + [0.0] * 24 + [None],  # a step without mixed groups: left out
            "diag/d11_len_pos_mean": [12.0] * 50,
            "diag/d11_len_neg_mean": [10.0] * 25 + [12.0] * 24 + [None],
        },
    }
    lines = testbed4_report.phase_lines({"grpo": [run]})
    assert lines[0] == "| arm | steps 1-25 | steps 26-50 |"
    assert lines[2] == "| grpo | 0.1 / 2.00 | 0 / 0.00 |"


def test_detectable_difference_counts_the_spread_between_arms_of_a_class(tmp_path):
    from experiments import testbed4_report

    # seeds agree within each arm (noise 0.01), but the coupled arms differ from each other by 2: the class
    # test faces that spread, so what it can detect is of its order, not of the seed noise's
    runs = {
        objective: [
            {**_fake_run(objective, seed, drift), "objective": objective, "seed": seed} for seed in range(3)
        ]
        for objective, drift in {"grpo": 1.0, "grpo_ar": 3.0, "cp_grpo": 0.0, "dfpo_min": 0.0}.items()
    }
    rows = testbed4_report.claim_rows(runs)
    drift = next(r for r in rows if r["claim"].name == "Reward-irrelevant drift")
    assert drift["detectable"] > 2.0
    length = next(r for r in rows if r["claim"].name == "Length bias")
    assert (length["claim"].worse_if_coupled, length["claim"].predicted_by) == (+1, "Dr. GRPO")


def test_the_dose_note_reports_the_residual_the_length_gap_and_the_entropy_it_had():
    from experiments import testbed4_report

    def run(d2_early, d2_late):
        return {
            "steps": list(range(1, 101)),
            "curves": {
                "diag/d2_residual": [d2_early] * 25 + [d2_late] * 75,
                "diag/d11_len_pos_mean": [10.0] * 100,
                "diag/d11_len_neg_mean": [14.0] * 25 + [10.5] * 75,
                "diag/d7_entropy_mean": [0.9] * 5 + [0.5] * 40 + [0.05] * 55,
            },
        }

    text = testbed4_report.dose_sentence({"grpo": [run(0.1, 0.02)], "cp_grpo": [run(0.0, 0.0)]})
    assert "averaged 4.00 tokens over steps 1-25 and 0.50 over steps 76-100" in text
    assert "D2 averaged 0.04 over the run and 0.02 over steps 76-100" in text
    assert "from 0.90 (steps 1-5) to 0.05 (steps 46-50)" in text
    assert "not evidence" in text


def test_a_run_that_gives_back_most_of_its_gain_is_named():
    from experiments import testbed4_report

    def run(seed, *acc):
        evals = {str(25 * i): {"eval/greedy/accuracy": a} for i, a in enumerate(acc)}
        return {"seed": seed, "evals": evals}

    runs = {
        "grpo": [run(0, 0.2, 0.7, 0.6), run(1, 0.2, 0.2, 0.2)],  # kept most of its gain; never gained
        "cp_grpo": [run(4, 0.2, 0.6, 0.3, 0.25)],
    }
    assert testbed4_report.collapse_sentence(runs) == (
        "Runs that gave back more than 50% of their gain in held-out greedy accuracy, of all 3: "
        "cp_grpo seed 4 (0.20 at step 0, 0.60 at its best at step 25, 0.25 at step 75)."
    )
    assert testbed4_report.collapse_sentence({"grpo": runs["grpo"]}).endswith("of all 2: none.")


def test_answer_forms_blank_the_numbers_and_count_the_settled_share():
    from experiments import testbed4_report

    assert testbed4.answer_format("75 + 58  = 133\n") == "N + N = N"
    samples = [
        {"mode": "greedy", "response": "75 + 58 = 133"},
        {"mode": "greedy", "response": "1 + 2 = 3"},
        {"mode": "greedy", "response": "The answer is 3."},
        {"mode": "sampled", "response": "3"},
        {"mode": "sampled", "response": "4"},
    ]
    m = testbed4.format_metrics(samples)
    assert m["format/greedy_top_share"] == pytest.approx(2 / 3)
    assert m["format/sampled_top_share"] == 1.0 and m["format/sampled_forms"] == 1.0
    assert math.isnan(testbed4.format_metrics(samples[:3])["format/sampled_top_share"])

    def run(share_at_25):
        share = {"format/greedy_top_share": share_at_25, "format/sampled_top_share": 0.9}
        return {"evals": {"0": {"format/greedy_top_share": 0.7}, "25": share, "150": share}}

    text = testbed4_report.format_sentence({"grpo": [run(0.95)], "cp_grpo": [run(1.0)]})
    assert "0.70-0.70 at step 0, 0.95-1.00 at step 25" in text and "Every run answers 90%" in text
    assert "Not every run" in testbed4_report.format_sentence({"grpo": [run(0.5)], "cp_grpo": [run(1.0)]})
