"""Experiment trackers beside metrics.jsonl: MLflow and Weights & Biases (offline by default).

The spec chooses which (`trackers:`); where they log and any credentials come from the trainer's environment,
which the operator sets (the control plane's `trainer_env`: MLFLOW_TRACKING_URI, WANDB_MODE, WANDB_API_KEY...),
never from a tenant's spec. Each tracker runs on its own thread behind a bounded queue: a slow, unreachable or
failing tracker drops what does not fit (counted), warns, and never fails or slows the job. metrics.jsonl stays
the record; a tracker receives the same per-step metrics.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from tgc_rl.config import MlflowTrackerSpec, TrackerSpec, WandbTrackerSpec
from tgc_rl.run_layout import JobState
from tgc_rl.wire import TraceRecord

log = logging.getLogger("tgc.trackers")

QUEUE_SIZE = (
    256  # calls waiting per tracker; more are dropped (a tracker far behind is not worth stalling on)
)
MAX_FAILURES = 5  # consecutive failed calls before a tracker is switched off for the rest of the run
SAMPLE_COLUMNS = (
    "step",
    "group",
    "index",
    "prompt",
    "response",
    "reward",
    "advantage",
    "length",
    "finish_reason",
)


@dataclass(frozen=True)
class RunInfo:
    """What every tracker is told when its run starts."""

    job: str  # the job's name (the tracker run's name)
    job_id: str  # the control plane's id ("" for `tgc train`)
    run_dir: Path
    params: Mapping[str, str]  # the resolved spec, flattened to dotted keys


@dataclass(frozen=True)
class RunEnd:
    state: JobState  # succeeded | cancelled | failed
    final_checkpoint: str | None
    artifacts: Sequence[Path]  # curves.png, spec.yaml ...: uploaded where the tracker keeps files


class Tracker(Protocol):
    name: str

    def start(self, run: RunInfo) -> None: ...
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def log_samples(self, step: int, records: Sequence[TraceRecord]) -> None: ...
    def finish(self, end: RunEnd) -> None: ...


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested spec as `{"objective.name": "cp_grpo", ...}` (lists as JSON), the form trackers keep params in."""
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    text = json.dumps(value) if isinstance(value, list | tuple) else str(value)
    return {prefix.rstrip("."): text}


# -- MLflow -------------------------------------------------------------------------------------------------
_MLFLOW_KEY = re.compile(r"[^\w\-. :/]")  # the characters MLflow accepts in metric and param keys
MLFLOW_VALUE_CHARS = 6000  # MLflow's limit on a param value
MLFLOW_BATCH = 100  # params per log_batch call (MLflow's limit); metrics per call are limited to 1000


class MlflowTracker:
    """An MLflow run per trainer attempt: params (the resolved spec), metrics per step, the last samples and
    the curves as artifacts, the final checkpoint's path as a tag; ends FINISHED, KILLED or FAILED."""

    name = "mlflow"

    def __init__(self, spec: MlflowTrackerSpec, tracking_uri: str):
        from mlflow.tracking import MlflowClient

        self.spec = spec
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.run_id = ""
        self._last_samples: tuple[int, str] | None = None

    def start(self, run: RunInfo) -> None:
        exp = self.client.get_experiment_by_name(self.spec.experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.spec.experiment)
        tags = {"tgc.job": run.job, "tgc.job_id": run.job_id, "tgc.run_dir": str(run.run_dir)}
        self.run_id = self.client.create_run(exp_id, run_name=run.job, tags=tags).info.run_id
        from mlflow.entities import Param

        params = [Param(_MLFLOW_KEY.sub("_", k)[:250], v[:MLFLOW_VALUE_CHARS]) for k, v in run.params.items()]
        for i in range(0, len(params), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + MLFLOW_BATCH])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(_MLFLOW_KEY.sub("_", k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(rows), 1000):
            self.client.log_batch(self.run_id, metrics=rows[i : i + 1000])

    def log_samples(self, step: int, records: Sequence[TraceRecord]) -> None:
        # kept for the end: one samples artifact per run, not one per step (the run dir keeps every step's)
        self._last_samples = (step, "".join(r.model_dump_json() + "\n" for r in records))

    def finish(self, end: RunEnd) -> None:
        if self._last_samples is not None:
            step, text = self._last_samples
            self.client.log_text(self.run_id, text, f"samples/step-{step:08d}.jsonl")
        for path in end.artifacts:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        if end.final_checkpoint:
            self.client.set_tag(self.run_id, "tgc.final_checkpoint", end.final_checkpoint)
        status = {JobState.SUCCEEDED: "FINISHED", JobState.CANCELLED: "KILLED"}.get(end.state, "FAILED")
        self.client.set_terminated(self.run_id, status=status)


# -- Weights & Biases -----------------------------------------------------------------------------------------
class WandbTracker:
    """A wandb run in the run directory (`<run_dir>/wandb/`), offline unless the operator's environment says
    otherwise (WANDB_MODE): metrics per step, the config (the resolved spec), a samples table every
    `samples_every` steps. An offline run is uploaded later with `wandb sync <run_dir>/wandb/offline-run-*`."""

    name = "wandb"

    def __init__(self, spec: WandbTrackerSpec):
        self.spec = spec
        self.run: Any = None

    def start(self, run: RunInfo) -> None:
        import wandb

        mode: Literal["online", "offline", "disabled"] = "offline"
        if os.environ.get("WANDB_MODE") in ("online", "disabled"):  # the operator's choice; offline otherwise
            mode = "online" if os.environ["WANDB_MODE"] == "online" else "disabled"
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True)
        self.run = wandb.init(
            mode=mode,
            dir=str(run.run_dir),
            project=self.spec.project,
            name=run.job,
            config=dict(run.params),
            settings=settings,
            tags=[t for t in [run.job_id] if t],
        )

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_samples(self, step: int, records: Sequence[TraceRecord]) -> None:
        if step % self.spec.samples_every:
            return
        import wandb

        rows = [[getattr(r, c) for c in SAMPLE_COLUMNS] for r in records]
        self.run.log({"samples": wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)}, step=step)

    def finish(self, end: RunEnd) -> None:
        self.run.summary["tgc/state"] = str(end.state)
        if end.final_checkpoint:
            self.run.summary["tgc/final_checkpoint"] = end.final_checkpoint
        self.run.finish(exit_code=0 if end.state == JobState.SUCCEEDED else 1)
        import wandb

        wandb.teardown()  # its service process (wandb-core) would otherwise live as long as the trainer


# -- the queue in front of each tracker ----------------------------------------------------------------------
@dataclass
class TrackerStats:
    sent: int = 0
    dropped: int = 0  # calls that found the queue full
    failed: int = 0  # calls that raised
    off: bool = False  # switched off after MAX_FAILURES in a row (or a failed start)


@dataclass(frozen=True)
class _Call:
    run: Callable[[], None]
    is_start: bool = False  # a failed start switches the tracker off at once


@dataclass
class _Worker:
    tracker: Tracker
    stats: TrackerStats = field(default_factory=TrackerStats)
    calls: queue.Queue[_Call | None] = field(default_factory=lambda: queue.Queue(QUEUE_SIZE))
    thread: threading.Thread | None = None

    def run(self) -> None:
        in_a_row = 0
        while (call := self.calls.get()) is not None:
            if self.stats.off:
                continue
            try:
                call.run()
                self.stats.sent += 1
                in_a_row = 0
            except Exception as e:  # a tracker's failure is the tracker's: the job goes on
                self.stats.failed += 1
                in_a_row += 1
                log.warning("tracker %s: %s", self.tracker.name, e, exc_info=self.stats.failed == 1)
                if in_a_row >= MAX_FAILURES or call.is_start:
                    self.stats.off = True
                    log.warning("tracker %s: switched off for the rest of the run", self.tracker.name)


class Trackers:
    """The run's trackers: every call returns at once (queued; dropped and counted when a queue is full)."""

    def __init__(self, trackers: Sequence[Tracker]):
        self._workers = [_Worker(t) for t in trackers]
        for w in self._workers:
            w.thread = threading.Thread(target=w.run, name=f"tracker-{w.tracker.name}", daemon=True)
            w.thread.start()

    @classmethod
    def from_spec(cls, specs: Sequence[TrackerSpec], run: RunInfo) -> Trackers:
        """The spec's trackers, started (in the background). One that cannot be built here (a package missing, no
        MLFLOW_TRACKING_URI) is left out with a warning."""
        built: list[Tracker] = []
        for spec in specs:
            try:
                built.append(_build(spec))
            except Exception as e:
                log.warning("tracker %s not used: %s", spec.kind, e)
        trackers = cls(built)
        trackers._each(lambda t: lambda: t.start(run), is_start=True)
        return trackers

    def __bool__(self) -> bool:
        return bool(self._workers)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        row = dict(metrics)
        self._each(lambda t: lambda: t.log_metrics(step, row))

    def log_samples(self, step: int, records: Sequence[TraceRecord]) -> None:
        rows = list(records)
        self._each(lambda t: lambda: t.log_samples(step, rows))

    def stats(self) -> dict[str, float]:
        """`trackers/<name>/dropped|failed|off`, for the step's metrics."""
        out: dict[str, float] = {}
        for w in self._workers:
            out[f"trackers/{w.tracker.name}/dropped"] = float(w.stats.dropped)
            out[f"trackers/{w.tracker.name}/failed"] = float(w.stats.failed)
            out[f"trackers/{w.tracker.name}/off"] = float(w.stats.off)
        return out

    def close(self, end: RunEnd, timeout_s: float = 60.0) -> None:
        """Finishes every run and waits for the queues to drain, at most `timeout_s` in all (a tracker still busy
        then is left to its daemon thread, with a warning: the job's end does not wait on it)."""
        self._each(lambda t: lambda: t.finish(end))
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            try:
                w.calls.put(None, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                pass
        for w in self._workers:
            assert w.thread is not None
            w.thread.join(max(0.0, deadline - time.monotonic()))
            if w.thread.is_alive():
                log.warning(
                    "tracker %s: still busy after %.0f s at the end of the run; not waited for",
                    w.tracker.name,
                    timeout_s,
                )

    def _each(self, make: Callable[[Tracker], Callable[[], None]], is_start: bool = False) -> None:
        for w in self._workers:
            try:
                w.calls.put_nowait(_Call(make(w.tracker), is_start))
            except queue.Full:
                w.stats.dropped += 1


def _build(spec: TrackerSpec) -> Tracker:
    if isinstance(spec, MlflowTrackerSpec):
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if not uri:
            raise RuntimeError(
                "MLFLOW_TRACKING_URI is not set in the trainer's environment (the operator sets it in the control "
                "plane's trainer environment, TGC_TRAINER_ENV)"
            )
        return MlflowTracker(spec, uri)
    return WandbTracker(spec)
