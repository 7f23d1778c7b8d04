"""The scheduler's invariants are checked by real errors (an `assert` vanishes under `python -O`)."""

import dataclasses

import pytest

from tgc_rl.control.scheduler import Scheduler, SchedulerInvariantError
from tgc_rl.control.settings import ControlSettings
from tgc_rl.control.states import JobState
from tgc_rl.control.store import JobRow


def _scheduler(tmp_path) -> Scheduler:
    settings = ControlSettings(data_dir=tmp_path, ray_address="none")
    return Scheduler(store=None, token_store=None, settings=settings, telemetry=None)  # type: ignore[arg-type]


def _job(**fields) -> JobRow:
    names = [f.name for f in dataclasses.fields(JobRow) if f.name != "transitions"]
    base = dict.fromkeys(names)
    base.update(id="job_1", state=JobState.RUNNING, spec={}, grants="", latest_metrics={}, hard_stopped=False)
    return JobRow(**{**base, **fields})


class _Ray:
    def stop(self, sub_id: str) -> None:
        raise AssertionError("must not be reached")


def test_a_tick_without_a_ray_connection_raises(tmp_path):
    with pytest.raises(SchedulerInvariantError, match="not connected to Ray"):
        _scheduler(tmp_path).tick()


def test_monitoring_or_submitting_a_job_without_its_ray_fields_raises(tmp_path):
    scheduler = _scheduler(tmp_path)
    scheduler.ray = _Ray()  # type: ignore[assignment]
    with pytest.raises(SchedulerInvariantError, match="job_1 .* no Ray submission id"):
        scheduler._monitor(_job())
    with pytest.raises(SchedulerInvariantError, match="no run directory"):
        scheduler._submit(_job(ray_submission_id="sub-1"))
    with pytest.raises(SchedulerInvariantError, match="never requested"):
        scheduler._enforce_cancel(_job(ray_submission_id="sub-1"))
