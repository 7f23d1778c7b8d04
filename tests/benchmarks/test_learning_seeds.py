"""benchmarks/learning_seeds.py without a job: the variants' specs, the held-out set, the scoring of evaluation
records, the resume-from-results logic and the summary."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from tgc_rl.config import JobSpec
from tgc_rl.tasks import load_task

_ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("learning_seeds", _ROOT / "benchmarks" / "learning_seeds.py")
ls = importlib.util.module_from_spec(_SPEC)
sys.modules["learning_seeds"] = ls  # dataclasses look their module up while the file runs
_SPEC.loader.exec_module(ls)

DEFAULT = yaml.safe_load((_ROOT / "examples" / "default.yaml").read_text())


def _spec(name: str, seed: int = 1, tmp: Path = Path("/nonexistent/heldout.jsonl")) -> JobSpec:
    return JobSpec.parse(ls.job_dict(DEFAULT, ls.variant(name), seed, tmp))


def test_variants_are_the_default_job_but_for_their_one_change():
    base = JobSpec.parse(DEFAULT)
    specs = {v.name: _spec(v.name) for v in ls.VARIANTS}
    assert [s.async_.mode for s in specs.values()] == ["sync", "one_step_off", "k_step", "sync"]
    assert specs["k_step"].async_.max_staleness == 2 and specs["one_step_off"].async_.max_staleness == 1
    for name, s in specs.items():
        assert s.seed == 1 and s.steps == base.steps == 15
        assert s.checkpoint.every_steps == 0 and not s.checkpoint.save_optimizer
        assert s.model.source == base.model.source and s.task == base.task and s.objective == base.objective
        assert s.eval is not None and s.eval.greedy and s.eval.every_steps == 0
        assert (s.model.lora is not None) == (name == "lora")
    assert specs["sync"].optim.lr == base.optim.lr == 3e-5
    assert specs["lora"].optim.lr == pytest.approx(3e-4)  # 10x the full lr, LoraSpec's rule
    assert (specs["lora"].model.lora.rank, specs["lora"].model.lora.alpha) == (16, 32)
    assert DEFAULT["checkpoint"]["every_steps"] == 5  # the base mapping is not changed in place
    assert JobSpec.parse(ls.job_dict(DEFAULT, ls.variant("sync"), 0, Path("/x"), steps=2)).steps == 2
    with pytest.raises(ValueError, match="unknown variant"):
        ls.variant("async")


def test_heldout_rows_are_every_problem_the_task_can_draw(tmp_path):
    rows = ls.heldout_rows(DEFAULT["task"]["params"])
    assert len(rows) == 100 and len({r["prompt"] for r in rows}) == 100
    assert [r["id"] for r in rows] == [str(i) for i in range(100)]
    assert rows[23] == {"id": "23", "prompt": "What is 2 + 3? Reply with just the number.", "answer": "5"}
    task = load_task("arithmetic", DEFAULT["task"]["params"], seed=2)
    by_prompt = {r["prompt"]: r["answer"] for r in rows}
    for i in range(500):  # the task's own items are all in the set, with the same references
        item = task.item(i)
        assert by_prompt[item.prompt] == item.answer
    path = ls.write_heldout(tmp_path / "h" / ls.HELDOUT_FILE, DEFAULT["task"]["params"])
    assert [json.loads(ln) for ln in path.read_text().splitlines()] == rows
    assert len(ls.heldout_rows({"max_operand": 2, "ops": ["+", "-"]})) == 18


def _rows():
    return [{"id": str(i), "prompt": f"p{i}", "answer": str(i)} for i in range(4)]


def test_score_eval_uses_the_task_rule_and_splits_unseen_rows():
    records = [
        {"row": "0", "response": "0", "reward": 1.0},
        {"row": "1", "response": "1 + 0 = 1", "reward": 1.0},
        {
            "row": "2",
            "response": "2 or maybe 7",
            "reward": 1.0,
        },  # the math verifier's leniency; last number 7
        {"row": "3", "response": "no", "reward": 0.0},
    ]
    got = ls.score_eval(records, _rows(), trained={"p0", "p2"})
    assert got["accuracy"] == 0.5 and got["accuracy_verifier"] == 0.75
    assert got["n_unseen"] == 2 and got["accuracy_unseen"] == 0.5  # rows 1 (right) and 3 (wrong)
    assert math.isnan(ls.score_eval(records, _rows(), trained={"p0", "p1", "p2", "p3"})["accuracy_unseen"])
    assert ls.wrong_answers(records[::-1], _rows()) == [(2, "2 or maybe 7"), (3, "no")]
    with pytest.raises(ValueError, match="covered 3 of 4"):
        ls.score_eval(records[:3], _rows(), trained=set())


def test_runs_are_seed_major_and_finished_ones_are_skipped(tmp_path):
    order = ls.run_order()
    assert [(s, v.name) for s, v in order[:5]] == [
        (0, "sync"),
        (0, "one_step_off"),
        (0, "k_step"),
        (0, "lora"),
        (1, "sync"),
    ]
    assert len(order) == 12
    ls.result_path(tmp_path, ls.variant("one_step_off"), 0).write_text("{}")
    ls.result_path(tmp_path, ls.variant("lora"), 2).write_text("{}")
    left = ls.pending(tmp_path, order)
    assert (
        len(left) == 10
        and (0, ls.variant("one_step_off")) not in left
        and left[1] == (0, ls.variant("k_step"))
    )


def _result(name: str, seed: int, rewards: list[float], step_s: float, acc: tuple[float, float]) -> dict:
    return {
        "variant": {"name": name},
        "seed": seed,
        "lr": 3e-5,
        "steps": [{"step": i + 1, "reward": r, "step_s": step_s} for i, r in enumerate(rewards)],
        "evals": [
            {"step": 15, "accuracy": acc[1], "accuracy_unseen": acc[1] / 2},
            {"step": 0, "accuracy": acc[0], "accuracy_unseen": acc[0]},
        ],
        "wall_s": 100.0 + seed,
        "started_utc": f"2026-11-27 2{seed}:00:00",
        "load_start": 2.0 + seed,
        "cpu": "AMD EPYC",
        "cores": 2,
    }


def test_summary_windows_seconds_to_target_and_spread():
    slow = [0.5] * 5 + [0.8] * 5 + [0.95] * 5
    fast = [0.5] * 3 + [0.9] + [0.5] + [1.0] * 10
    results = [
        _result("sync", 0, slow, 40.0, (0.4, 0.9)),
        _result("sync", 1, fast, 40.0, (0.6, 1.0)),
        _result("k_step", 0, [0.1] * 15, 20.0, (0.4, 0.5)),
    ]
    assert ls.seconds_to(results[0]) == 11 * 40.0 and ls.seconds_to(results[1]) == 4 * 40.0
    assert ls.seconds_to(results[2]) is None
    assert ls.window_reward(results[1], 1, 5) == pytest.approx(0.58)
    assert ls.window_reward(_result("sync", 0, [0.5] * 7, 1.0, (0, 0)), 6, 10) is None  # an incomplete window
    rows = ls.summary(results)
    assert [r["variant"] for r in rows] == ["sync", "k_step"]  # VARIANTS order, absent ones left out
    sync = rows[0]
    assert sync["reward_6_10"] == [0.8, 1.0] and sync["heldout_start"] == [0.4, 0.6]
    assert sync["heldout_end"] == [0.9, 1.0] and sync["unseen_end"] == [0.45, 0.5]
    assert sync["train_s"] == [600.0, 600.0] and sync["step_s"] == [40.0, 40.0]
    assert ls._mean_sd(sync["reward_6_10"]) == "0.900 ± 0.141"
    assert ls._mean_sd([0.25]) == "0.250" and ls._mean_sd([]) == "-"
    text = ls.table(rows)
    assert "| sync | 0,1 | 3e-05 | 0.540 ± 0.057 | 0.900 ± 0.141 |" in text
    assert "| 300 (2/2) |" in text and "not reached" in text.splitlines()[-1]


def test_report_fills_only_its_block(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text(f"# before\n{ls.BEGIN}\nold table\n{ls.END}\nafter\n")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "sync-seed0.json").write_text(
        json.dumps(_result("sync", 0, [0.5] * 15, 40.0, (0.4, 0.9)))
    )
    ls.report(tmp_path / "r", md)
    text = md.read_text()
    assert text.startswith(f"# before\n{ls.BEGIN}\n1 runs;") and text.endswith(f"{ls.END}\nafter\n")
    assert "old table" not in text and "| 15 | 0.500 |" in text
    assert "| sync | 0 | 0.500 | 0.40 -> 0.90 | 0.45 | 600 | 100 |" in text
    md.write_text("no block\n")
    with pytest.raises(SystemExit, match="no <!-- learning_seeds:begin -->"):
        ls.report(tmp_path / "r", md)
