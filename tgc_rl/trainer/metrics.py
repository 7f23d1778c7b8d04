"""Per-step metrics: JSONL and TensorBoard in the run directory, Prometheus through Ray's metrics API,
and one console line per step (above a progress bar in a terminal, plain lines in a log file)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tgc_rl.trainer.trackers import Trackers

from tgc_rl.run_layout import (
    HEADLINE_METRICS,
    METRIC_GAUGE,
    METRICS_FILE,
    MT_TOOL_CALLS,
    MT_TURNS_PER_TRAJECTORY,
    STEP_GAUGE,
    TENSORBOARD_DIR,
)


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """A run's metrics.jsonl, one row per step in step order: lines of the same step (an evaluation logged
    apart from its step's training metrics, or a step written again) merge, later values winning."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics (is {run_dir} a run directory?)")
    rows: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            step = int(row["step"])
            rows[step] = {**rows.get(step, {}), **row}
    return [rows[k] for k in sorted(rows)]


class MetricsSink:
    def __init__(
        self,
        run_dir: Path,
        job_name: str,
        total_steps: int,
        progress: bool | None = None,
        trackers: Trackers | None = None,
    ):
        self.trackers = trackers  # experiment trackers (spec.trackers): the same rows as metrics.jsonl
        self.path = run_dir / METRICS_FILE
        self.job_name, self.total_steps = job_name, total_steps
        self._tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / TENSORBOARD_DIR))
        except ImportError:  # tensorboard is optional for library users; the JSONL is the record
            pass
        self._gauges = _ray_gauges()
        self._lines = progress is not False  # `progress=False`: library use, nothing on the console
        self._progress = (
            _Progress(total_steps) if (progress if progress is not None else sys.stdout.isatty()) else None
        )

    def truncate_after(self, step: int) -> None:
        """On resume: forget steps the checkpoint does not contain, so no step is counted twice."""
        if not self.path.exists():
            return
        kept = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
        self.path.write_text("".join(ln + "\n" for ln in kept))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"step": step, **clean}) + "\n")
        if self.trackers:
            self.trackers.log_metrics(step, clean)
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._gauges is not None:
            step_gauge, metric_gauge = self._gauges
            step_gauge.set(step, tags={"job": self.job_name})
            for k, v in clean.items():
                metric_gauge.set(v, tags={"job": self.job_name, "metric": k})
        if self._progress is not None:
            self._progress.update(step, clean)
        elif self._lines:
            print(step_line(step, self.total_steps, clean), flush=True)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._progress is not None:
            self._progress.close()


def _ray_gauges():
    try:
        import ray
        from ray.util.metrics import Gauge

        if not ray.is_initialized():
            return None
        return (
            Gauge(STEP_GAUGE, "Last completed optimizer step of the job (steps).", tag_keys=("job",)),
            Gauge(
                METRIC_GAUGE,
                "Per-step training metric of the job; unit as in its name.",
                tag_keys=("job", "metric"),
            ),
        )
    except Exception:  # metrics export must never stop training
        return None


# A multi-turn step's line adds these after the headline metrics (a single-turn step has none of them).
MULTI_TURN_LINE = ((MT_TURNS_PER_TRAJECTORY, "turns"), (MT_TOOL_CALLS, "tools"))


def step_line(step: int, total: int, m: dict[str, float]) -> str:
    """`step 3/15  reward 0.41  acc 0.41  D2 1.2e-09  s/step 12.3`: the headline metrics a step has; a multi-turn
    step adds turns per trajectory and the step's tool calls (`turns 1.9  tools 7`)."""
    shown = [(h.name, h.short) for h in HEADLINE_METRICS] + list(MULTI_TURN_LINE)
    return f"step {step}/{total}  " + "  ".join(
        f"{short} {m[name]:.3g}" for name, short in shown if name in m
    )


class _Progress:
    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
        )
        self._task = self._bar.add_task("", total=total)
        self._total = total
        self._bar.start()

    def update(self, step: int, m: dict[str, float]) -> None:
        self._bar.console.print(step_line(step, self._total, m))  # kept above the bar: the run's history
        self._bar.update(self._task, completed=step)

    def close(self) -> None:
        self._bar.stop()
