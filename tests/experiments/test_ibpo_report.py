"""REPORT.md's IBPO section and ibpo_results.md, from hand-built run files (experiments/ibpo_report.py)."""

import json

from experiments.ibpo_compare import PLAN
from experiments.ibpo_report import load, results_markdown, section


def _run(objective, seed, accuracy, mask=None, state="succeeded", d2=(0.0, 0.01, 0.0), steps=4):
    """A run file as `ibpo_compare run` writes it; IBPO arms carry the revision figures and three D2s."""
    spec = {
        "name": f"tgc-ibpo-{objective}-arithmetic-s{seed}" + (f"-{mask}" if mask else ""),
        "objective": {"name": objective},
        "task": {"name": "arithmetic"},
        "seed": seed,
        "steps": 4,
        "prompts_per_step": 8,
        "group_size": 8,
        "optim": {"lr": 3e-5},
        "sampling": {"max_new_tokens": 24},
    }
    if mask:
        spec["ibpo"] = {"mask": mask}
    rows = []
    for s in range(steps):
        row = {
            "step": s + 1,
            "reward/accuracy": accuracy[s],
            "diag/d2_residual": 0.1 if objective == "grpo" else 4e-9,
            "diag/d7_entropy_mean": 2.0,
            "timing/step_s": 50.0,
        }
        if objective == "ibpo_cp":
            row |= {
                "ibpo/revisions": 38.0,
                "ibpo/success_rate": 0.2,
                "ibpo/edited_frac_mean": 0.9,
                "ibpo/masked_token_frac": 0.01,
                "ibpo/generate_s": 9.0,
                "ibpo/reward_s": 1.0,
                "ibpo/preserves_cancellation": float(mask != "naive"),
                "ibpo/d2_residual": d2[1] if mask == "naive" else d2[2],
            }
            row |= {
                f"ibpo/{m}/d2_residual": v for m, v in zip(("none", "naive", "symmetric"), d2, strict=True)
            }
        rows.append(row)
    return {"spec": spec, "state": state, "seconds": 200.0, "steps": rows}


def _write(tmp_path, runs):
    results = tmp_path / "results" / "ibpo"
    results.mkdir(parents=True)
    for r in runs:
        (results / f"{r['spec']['name']}.json").write_text(json.dumps(r))
    return results


def _study(tmp_path, symmetric_d2=0.0):
    runs = []
    for seed in (0, 1, 2):
        base = [0.3, 0.25 + 0.01 * seed, 0.35, 0.4]
        runs += [
            _run("cp_grpo", seed, base),
            _run(
                "ibpo_cp",
                seed,
                [a + 0.01 * (i > 0) for i, a in enumerate(base)],
                d2=(0.0, 0.01, symmetric_d2),
            ),
            _run("grpo", seed, base, state="succeeded")
            if seed
            else _run("grpo", seed, [0.9, 0.9], state="failed", steps=2),
        ]
    return _write(tmp_path, runs)


def test_section_reports_every_arm_with_its_seeds_and_lists_failed_runs(tmp_path):
    text = "\n".join(section(_study(tmp_path), fig_dir=tmp_path / "results", report_dir=tmp_path))
    assert text.startswith("## IBPO")
    assert "grpo: seeds 1,2; failed: seed 0 (2 of 4 steps)" in text
    assert "| cp_grpo | 0,1,2 |" in text and "| ibpo_cp | 0,1,2 |" in text
    # a failed run enters no mean: grpo's first step is that of its two succeeded runs, not 0.9
    assert "| grpo | 1,2 | 0.3 ± 0 |" in text


def test_cancellation_finding_follows_the_d2_of_each_mask(tmp_path):
    ok = "\n".join(section(_study(tmp_path / "a")))
    assert (
        "naive edit mask breaks it, the symmetric one keeps it** (objectives.md sec. 3, derived): **reproduced**"
        in ok
    )
    broken = "\n".join(section(_study(tmp_path / "b", symmetric_d2=0.002)))
    assert "**not reproduced**" in broken


def test_the_mask_verdict_reaches_the_summary_of_results_that_hold_by_construction(tmp_path):
    from experiments.ibpo_report import mask_summary

    assert (
        "keep cancellation, the naive mask breaks it: **reproduced**"
        in mask_summary(_study(tmp_path / "a"))[0]
    )
    assert "**not reproduced**" in mask_summary(_study(tmp_path / "b", symmetric_d2=0.002))[0]
    assert mask_summary(tmp_path / "none") == []


def test_accuracy_difference_is_paired_by_seed_and_judged_by_its_permutation_p(tmp_path):
    text = "\n".join(section(_study(tmp_path)))
    line = next(ln for ln in text.splitlines() if "IBPO shaping (symmetric mask) over its base" in ln)
    # +0.01 on every step after the first, every seed; 3 seeds a side cannot reach p < 0.05
    assert "+0.010, +0.010, +0.010" in line and "**no test possible at 3 v 3; higher in these runs**" in line
    assert "95% CI" in line
    assert "smallest possible p is 0.1" in line


def test_figure_is_drawn_and_linked_relative_to_the_report(tmp_path):
    text = "\n".join(section(_study(tmp_path), fig_dir=tmp_path / "results", report_dir=tmp_path))
    png = tmp_path / "results" / "ibpo_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](results/ibpo_curves.png)" in text


def test_no_runs_give_no_section(tmp_path):
    assert section(tmp_path / "nowhere") == []


def test_results_file_lists_every_run_and_the_failed_seeds_of_each_condition(tmp_path):
    runs = load(_study(tmp_path))
    text = results_markdown(runs, PLAN)
    assert text.count("| tgc-ibpo-") == 9
    assert "| grpo | 1,2 | 0 |" in text and "| cp_grpo | 0,1,2 | - |" in text


def test_entropy_of_every_arm_is_compared_with_cp_grpo(tmp_path):
    line = next(ln for ln in section(_study(tmp_path)) if ln.startswith("- Mean token entropy"))
    assert all(f"{arm} 2 " in line for arm in ("grpo", "cp_grpo", "ibpo_cp"))
    assert "**no test possible at 3 v 3; " in line and "no difference detected" not in line


def test_learner_d2_of_runs_before_it_saw_the_mask_is_named(tmp_path):
    text = "\n".join(section(_study(tmp_path)))
    # hand-built runs carry no `code` record, as the runs made before runs recorded their commit
    assert "runs before it (tgc-ibpo-ibpo_cp-arithmetic-s0" in text
