"""The run contract (tgc_rl/run_layout.py): the trainer writes the events the control plane reads back, as
the same typed objects; lines it cannot read never stop it; one list of headline metrics feeds the console,
the summary, curves.png and the CLI."""

import json

import pytest
from pydantic import ValidationError

from tgc_rl.cli_remote import _metrics_text
from tgc_rl.config import JobSpec
from tgc_rl.control import progress
from tgc_rl.run_layout import (
    CURVE_PANELS,
    EVENTS_FILE,
    HEADLINE_METRICS,
    METRICS_FILE,
    CheckpointEvent,
    JobState,
    LogEvent,
    OtherEvent,
    StateEvent,
    StepEvent,
)
from tgc_rl.trainer.main import summary
from tgc_rl.trainer.metrics import step_line
from tgc_rl.trainer.reporting import Reporter


def test_what_the_trainer_writes_the_control_plane_reads_as_the_same_events(tmp_path):
    r = Reporter(tmp_path)
    r.state(JobState.RUNNING, "started", 0)
    r.step(1, {"reward/mean": 0.5, "loss": float("nan")})
    r.checkpoint(1, tmp_path / "checkpoints" / "step_1")
    r.log("halfway")
    r.state(JobState.SUCCEEDED, "done", 1)
    read = progress.read_run_dir_events(str(tmp_path))
    assert [type(e) for e in read] == [StateEvent, StepEvent, CheckpointEvent, LogEvent, StateEvent]
    assert read[1] == StepEvent(time=read[1].time, step=1, metrics={"reward/mean": 0.5, "loss": None})
    assert read[2].path == str(tmp_path / "checkpoints" / "step_1") and read[4].state == JobState.SUCCEEDED


def test_a_trainer_cannot_write_an_event_the_control_plane_would_refuse(tmp_path):
    r = Reporter(tmp_path)
    with pytest.raises(ValidationError, match="a trainer cannot report 'queued'"):
        r.state(JobState.QUEUED, "not mine to say")
    assert not (tmp_path / EVENTS_FILE).exists()
    r.step(1, {"reward/mean": 0.5, "note": "high", "flag": True})  # as in metrics.jsonl: numbers only
    (written,) = progress.read_run_dir_events(str(tmp_path))
    assert isinstance(written, StepEvent) and written.metrics == {"reward/mean": 0.5, "flag": 1.0}


def test_unknown_and_malformed_lines_are_kept_or_skipped_never_raised(tmp_path):
    lines = [
        json.dumps({"type": "step", "time": 1.0, "step": 1, "metrics": {"a": 1}}),
        json.dumps({"type": "rollout_sample", "time": 2.0, "text": "a newer trainer's event"}),
        json.dumps([1, 2]),  # not an object
        json.dumps({"type": "checkpoint", "time": 3.0, "step": -1, "path": "/x"}),  # a field out of range
        json.dumps({"type": "state", "time": 4.0, "state": "queued"}),  # a state only the control plane sets
        json.dumps(
            {"type": "step", "time": 5.0, "step": 2**40, "metrics": {}}
        ),  # beyond the store's integers
        json.dumps({"type": "step", "time": 6.0, "step": 3, "metrics": {"huge": 10**400}}),  # kept, as null
        "null",
        '{"type": "log", "ti',  # cut by a crash
    ]
    (tmp_path / EVENTS_FILE).write_text("\n".join(lines))
    read = progress.read_run_dir_events(str(tmp_path))
    assert [type(e) for e in read] == [StepEvent, OtherEvent, StepEvent]
    assert read[2].metrics == {"huge": None}
    assert read[1].type == "rollout_sample" and read[1].wire()["text"] == "a newer trainer's event"


def test_one_list_of_headline_metrics_feeds_console_summary_curves_and_cli(tmp_path):
    row = {h.name: 0.5 for h in HEADLINE_METRICS}
    assert step_line(1, 2, row) == "step 1/2  " + "  ".join(f"{h.short} 0.5" for h in HEADLINE_METRICS)
    (tmp_path / METRICS_FILE).write_text(json.dumps({"step": 1, **row}) + "\n")
    said = summary(JobSpec(), tmp_path, JobState.SUCCEEDED).splitlines()
    assert [ln.split(":")[0].strip() for ln in said[1 : 1 + len(HEADLINE_METRICS)]] == [
        h.label for h in HEADLINE_METRICS
    ]
    drawn = [name for _, series in CURVE_PANELS for name, _ in series]
    assert all(h.name in drawn for h in HEADLINE_METRICS)
    columns = _metrics_text({"aaa": 1.0, "loss": 2.0, **row}, n=len(HEADLINE_METRICS)).split("  ")
    assert [c.split("=")[0] for c in columns] == [h.name for h in HEADLINE_METRICS]
