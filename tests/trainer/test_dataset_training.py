"""Jobs on a dataset file exported here: held-out evaluation at step 0, every N steps and at the end,
`epochs` ending the job, resume mid-epoch, and evaluation without training."""

import json

import pytest

from tgc_rl.tasks.dataset import DatasetTask
from tgc_rl.tasks.export import export_rows, write_rows
from tgc_rl.trainer.main import run

from .conftest import read_events, read_metrics, tiny_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_rows(
        export_rows("arithmetic", {"max_operand": 9}, 20), tmp_path_factory.mktemp("d") / "a.parquet"
    )


def _spec(data_file, **changes):
    base = {
        "task.name": "dataset",
        "task.reward": "builtin",
        "checkpoint.every_steps": 0,
        "task.params": {"path": str(data_file), "holdout": 4},
    }  # 16 training rows
    return tiny_spec(**{**base, **changes})


def _eval_rows(run_dir, step):
    return [json.loads(ln) for ln in (run_dir / "eval" / f"step_{step}.jsonl").read_text().splitlines()]


def test_held_out_rows_are_evaluated_at_the_start_every_n_steps_and_when_the_epochs_end(
    ray_cluster, tmp_path, data_file
):
    spec = _spec(
        data_file,
        steps=10,
        prompts_per_step=4,
        eval={"every_steps": 3},
        **{"task.params": {"path": str(data_file), "holdout": 4, "epochs": 1}},
    )
    assert run(spec, tmp_path) == "succeeded"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # 16 rows / 4 a step: one epoch is 4 steps
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 3, 4]  # start, every 3, the end
    final = [e for e in read_events(tmp_path) if e["type"] == "state"][-1]
    assert final["state"] == "succeeded" and "all 1 epoch(s) of the dataset at step 4" in final["reason"]
    held = {r.id for r in DatasetTask(role="holdout", path=str(data_file), holdout=4).rows}
    for r in rows:
        if "eval/accuracy" not in r:
            continue
        samples = _eval_rows(tmp_path, r["step"])
        assert {s["row"] for s in samples} == held and r["eval/prompts"] == 4 and r["eval/samples"] == 4
        assert r["eval/accuracy"] == sum(s["reward"] >= 1 for s in samples) / 4  # verdicts of the reward pool
        assert all(s["status"] == "ok" and s["detail"] for s in samples)  # math verifier: a verdict, not a 0
    assert rows[1]["data/epoch"] == 0.25 and rows[4]["data/epoch"] == 1.0


def test_resume_mid_epoch_continues_exactly(ray_cluster, tmp_path, data_file):
    parity = {"task.reward": "tests.trainer.rewards:text_parity", "eval": {"every_steps": 5}}
    full, part = tmp_path / "full", tmp_path / "part"
    assert run(_spec(data_file, steps=5, **parity), full) == "succeeded"
    assert run(_spec(data_file, steps=3, **{**parity, "checkpoint.every_steps": 1}), part) == "succeeded"
    assert (
        run(_spec(data_file, steps=5, **parity), part, resume="latest") == "succeeded"
    )  # 3 of 8 steps an epoch
    a, b = read_metrics(full), read_metrics(part)
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4, 5]
    for ra, rb in zip(a, b, strict=True):
        assert ra.get("reward/mean") == rb.get("reward/mean")  # the same rows in the same order, same samples
        assert ra.get("data/epoch") == rb.get("data/epoch")
        if "loss" in ra:
            assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-4, abs=1e-6)
    assert a[-1]["eval/accuracy"] == b[-1]["eval/accuracy"]  # held-out verdicts of the same weights
    assert _eval_rows(full, 5) == _eval_rows(part, 5)


# sampled evaluation (3 per prompt) with a greedy pass beside it
SAMPLED_AND_GREEDY = {"samples_per_prompt": 3, "greedy": False, "also_greedy": True}


@pytest.fixture(scope="module")
def resumed_at_step_zero(ray_cluster, tmp_path_factory, data_file):
    """One 1-step job, cancelled after its baseline evaluation and resumed from step 0, evaluating sampled with
    a greedy pass: the run of the resume-at-step-zero, the sampled evaluation and the evaluation-only tests
    (each job costs a start-up)."""
    run_dir = tmp_path_factory.mktemp("resumed_at_step_zero")
    (run_dir / "CANCEL").write_text("stopped before the first step")  # read after the baseline
    assert run(_spec(data_file, steps=1, eval=SAMPLED_AND_GREEDY), run_dir) == "cancelled"
    assert (run_dir / "checkpoints" / "step_0").is_dir()
    (run_dir / "CANCEL").unlink()
    assert run(_spec(data_file, steps=1, eval=SAMPLED_AND_GREEDY), run_dir, resume="latest") == "succeeded"
    return run_dir


def test_a_run_resumed_at_step_zero_keeps_its_baseline_and_does_not_evaluate_it_again(resumed_at_step_zero):
    run_dir = resumed_at_step_zero
    evaluated = [
        e["step"] for e in read_events(run_dir) if e["type"] == "step" and "eval/accuracy" in e["metrics"]
    ]
    assert evaluated == [0, 1]
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]
    reasons = [e["reason"] for e in read_events(run_dir) if e["type"] == "state" and e["state"] == "running"]
    assert reasons == ["started", "resumed"]  # a resume from step 0 is still a resume


def test_steps_zero_evaluates_a_checkpoint_without_training(
    ray_cluster, tmp_path, data_file, resumed_at_step_zero
):
    trained = resumed_at_step_zero
    spec = _spec(data_file, steps=0, eval={})
    assert run(spec, tmp_path / "eval", resume=trained / "checkpoints" / "step_1") == "succeeded"
    rows = read_metrics(tmp_path / "eval")
    assert [r["step"] for r in rows] == [0] and rows[0]["eval/prompts"] == 4
    assert not (tmp_path / "eval" / "checkpoints").exists()  # no learner, nothing to save
    # the checkpoint's weights answered: greedy responses equal the training run's final greedy evaluation
    assert [s["response"] for s in _eval_rows(tmp_path / "eval", 0)] == [
        s["response"] for s in _eval_rows(trained, 1) if s["mode"] == "greedy"
    ]


def test_sampled_evaluation_with_a_greedy_pass_reports_both(resumed_at_step_zero):
    final = read_metrics(resumed_at_step_zero)[-1]
    samples = _eval_rows(resumed_at_step_zero, 1)
    sampled = [s for s in samples if s["mode"] == "sampled"]
    greedy = [s for s in samples if s["mode"] == "greedy"]
    assert len(sampled) == 12 and len(greedy) == 4 and final["eval/samples"] == 12
    assert final["eval/greedy/samples"] == 4 and "eval/greedy/pass@1" in final and "eval/pass@3" in final
    assert final["eval/accuracy"] == sum(s["reward"] >= 1 for s in sampled) / 12
    assert final["eval/greedy/accuracy"] == sum(s["reward"] >= 1 for s in greedy) / 4
    for mode, prefix in ((sampled, "eval/"), (greedy, "eval/greedy/")):
        for name, verdict in (("correct", True), ("incorrect", False)):
            lengths = [s["tokens"] for s in mode if (s["reward"] >= 1) == verdict]
            key = f"{prefix}length_{name}_mean"
            assert final.get(key) == (sum(lengths) / len(lengths) if lengths else None)
