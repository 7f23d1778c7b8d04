"""The trainer's per-step metrics: JSONL record, TensorBoard scalars, the terminal progress line."""

import json

import pytest

from tgc_rl.trainer.metrics import MetricsSink, read_metrics


def test_each_step_reaches_jsonl_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = MetricsSink(tmp_path, "job", total_steps=3, progress=False)
    for step in (1, 2, 3):
        sink.log(step, {"reward/mean": step / 10, "diag/d1_gcpr": 0.0, "bad": float("nan"), "note": "text"})
    sink.close()
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": s, "reward/mean": s / 10, "diag/d1_gcpr": 0.0} for s in (1, 2, 3)]  # NaN dropped
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward/mean", "diag/d1_gcpr"}
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("reward/mean")] == [
        (1, 0.1),
        (2, 0.2),
        (3, 0.3),
    ]


def test_resume_truncates_steps_after_the_checkpoint(tmp_path):
    sink = MetricsSink(tmp_path, "job", total_steps=4, progress=False)
    for step in (1, 2, 3):
        sink.log(step, {"loss": float(step)})
    sink.close()
    again = MetricsSink(tmp_path, "job", total_steps=4, progress=False)
    again.truncate_after(2)
    again.log(3, {"loss": 30.0})
    again.close()
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_progress_line_shows_step_and_key_figures(tmp_path, capsys):
    sink = MetricsSink(tmp_path, "job", total_steps=2, progress=True)
    sink.log(1, {"reward/mean": 0.25, "reward/accuracy": 0.5, "timing/step_s": 12.0})
    sink.log(2, {"reward/mean": 0.75, "reward/accuracy": 1.0, "timing/step_s": 11.0})
    sink.close()
    out = capsys.readouterr().out
    assert "2/2" in out and "reward 0.75" in out and "acc 1" in out and "s/step 11" in out


def test_off_a_terminal_each_step_is_one_plain_line(tmp_path, capsys):
    sink = MetricsSink(tmp_path, "job", total_steps=2, progress=None)  # pytest's stdout is no terminal
    sink.log(
        1, {"reward/mean": 0.25, "reward/accuracy": 0.25, "diag/d2_residual": 1.5e-9, "timing/step_s": 12.34}
    )
    sink.log(2, {"reward/mean": 0.5, "timing/step_s": 11.0})
    sink.close()
    assert capsys.readouterr().out.splitlines() == [
        "step 1/2  reward 0.25  acc 0.25  D2 1.5e-09  s/step 12.3",
        "step 2/2  reward 0.5  s/step 11",
    ]


def test_curves_are_drawn_from_the_run_and_tgc_plot_redraws_them(tmp_path, capsys):
    from tgc_rl.cli import main
    from tgc_rl.trainer.curves import plot_run

    sink = MetricsSink(tmp_path, "job", total_steps=3, progress=False)
    for step in (1, 2, 3):
        sink.log(step, {"reward/mean": step / 4, "diag/d2_residual": 0.1 / step, "diag/d7_entropy_mean": 1.0})
    sink.close()
    png = plot_run(tmp_path)
    assert png == tmp_path / "curves.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png.unlink()
    assert main(["plot", str(tmp_path)]) == 0 and png.exists()
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "no metrics" in capsys.readouterr().err


def test_reading_metrics_merges_lines_of_one_step_in_step_order(tmp_path):
    lines = [
        {"step": 2, "loss": 2.0},
        {"step": 1, "loss": 1.0},
        {"step": 2, "eval/accuracy": 0.5},
        {"step": 3},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert read_metrics(tmp_path) == [
        {"step": 1, "loss": 1.0},
        {"step": 2, "loss": 2.0, "eval/accuracy": 0.5},
        {"step": 3},
    ]
    with pytest.raises(FileNotFoundError, match="run directory"):
        read_metrics(tmp_path / "missing")
