"""Where a job's progress goes: its run directory (events.jsonl) and, when it runs under the control plane,
the control plane's internal events endpoint, which answers whether the job should stop."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from numbers import Real
from pathlib import Path
from typing import Any

from tgc_rl.run_layout import (
    EVENTS_FILE,
    CheckpointEvent,
    JobState,
    LogEvent,
    StateEvent,
    StepEvent,
    TrainerEvent,
)

log = logging.getLogger("tgc.trainer")


class Reporter:
    """Appends events (the union of tgc_rl/run_layout.py) to `events.jsonl` and forwards them to the control
    plane when configured.

    Reporting never stops training: a failed POST keeps the events buffered for the next attempt.
    """

    def __init__(
        self,
        run_dir: Path,
        url: str | None = None,
        job_id: str | None = None,
        token: str | None = None,
        timeout_s: float = 5.0,
    ):
        self.path = run_dir / EVENTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.url = f"{url.rstrip('/')}/v1/internal/jobs/{job_id}/events" if url and job_id else None
        self.token, self.timeout_s = token, timeout_s
        self._pending: list[dict[str, Any]] = []  # wire form of events not yet accepted
        self.cancel_requested: str | None = None  # reason, once the control plane asked to stop

    @classmethod
    def from_env(cls, run_dir: Path) -> Reporter:
        return cls(
            run_dir,
            os.environ.get("TGC_CONTROL_URL"),
            os.environ.get("TGC_JOB_ID"),
            os.environ.get("TGC_JOB_TOKEN"),
        )

    def emit(self, event: TrainerEvent) -> None:
        wire = event.wire()
        with open(self.path, "a") as fh:
            fh.write(json.dumps(wire) + "\n")
        if self.url:
            self._pending.append(wire)
            self.flush()

    def state(self, state: JobState, reason: str = "", step: int = 0) -> None:
        self.emit(StateEvent(time=time.time(), state=state, reason=reason, step=step))

    def step(self, step: int, metrics: Mapping[str, object]) -> None:
        """A step's metrics; values that are not numbers are left out, as in metrics.jsonl (a bad metric must
        not end the training it describes, nor make the control plane refuse the batch)."""
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, Real)}
        if len(numbers) < len(metrics):
            log.warning(
                "step %d: metrics that are not numbers not reported: %s",
                step,
                sorted(metrics.keys() - numbers.keys()),
            )
        self.emit(StepEvent(time=time.time(), step=step, metrics=numbers))

    def checkpoint(self, step: int, path: Path) -> None:
        self.emit(CheckpointEvent(time=time.time(), step=step, path=str(path)))

    def log(self, message: str) -> None:
        self.emit(LogEvent(time=time.time(), message=message))

    def flush(self) -> None:
        if not self.url or not self._pending:
            return
        import httpx

        try:
            r = httpx.post(
                self.url,
                json={"events": self._pending},
                timeout=self.timeout_s,
                headers={"Authorization": f"Bearer {self.token}"},
            )
            r.raise_for_status()
        except httpx.HTTPError as e:
            log.warning(
                "could not report %d events to the control plane (%s); will retry", len(self._pending), e
            )
            return
        self._pending.clear()
        reply = r.json() if r.content else {}
        if reply.get("cancel"):
            self.cancel_requested = reply.get("reason") or "cancel requested by the control plane"
