"""`Job`: a handle on one job of the control plane (refresh, wait, cancel, resume, metrics, stream)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx

from tgc_rl.sdk.errors import Unavailable, WaitTimeout
from tgc_rl.wire import (
    CheckpointInfo,
    JobEvent,
    JobRecord,
    JobState,
    LogPage,
    MetricPoint,
    SamplePage,
)

if TYPE_CHECKING:
    from tgc_rl.sdk.client import Client


class Job:
    def __init__(self, client: Client, record: dict[str, Any] | JobRecord):
        self._client = client
        self.record = record if isinstance(record, JobRecord) else JobRecord.model_validate(record)

    def __repr__(self) -> str:
        step = f", step {self.record.step}/{self.record.total_steps}" if self.record.step is not None else ""
        return f"Job({self.id!r}, {self.state.value}{step})"

    # -- the record -------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.record.id

    @property
    def state(self) -> JobState:
        return self.record.state

    @property
    def reason(self) -> str:
        return self.record.reason

    @property
    def step(self) -> int | None:
        return self.record.step

    @property
    def done(self) -> bool:
        return self.record.state.terminal

    def refresh(self) -> Job:
        self.record = JobRecord.model_validate(self._client.request("GET", f"/v1/jobs/{self.id}").json())
        return self

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> Job:
        """Block until the job ends (succeeded, failed or cancelled); `WaitTimeout` after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {self.id} is still {self.state.value} after {timeout}s")
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))
        return self

    # -- control ----------------------------------------------------------------------------------
    def cancel(self, reason: str = "cancelled by user") -> Job:
        """Ask the job to stop: it checkpoints at the next step boundary and ends `cancelled`."""
        r = self._client.request(
            "POST", f"/v1/jobs/{self.id}/cancel", json={"reason": reason}, idempotent=True
        )
        self.record = JobRecord.model_validate(r.json())
        return self

    def resume(self, checkpoint: str | None = None, reason: str = "resumed by user") -> Job:
        """Start a new attempt of a failed/cancelled job from a checkpoint (default: the newest)."""
        r = self._client.request(
            "POST",
            f"/v1/jobs/{self.id}/resume",
            json={"checkpoint": checkpoint, "reason": reason},
            idempotent=False,
        )
        self.record = JobRecord.model_validate(r.json())
        return self

    # -- progress ---------------------------------------------------------------------------------
    def metrics(self, since_step: int | None = None, attempt: int | None = None) -> list[MetricPoint]:
        """Per-step metrics as reported by the trainer, oldest first."""
        params = {k: v for k, v in (("since_step", since_step), ("attempt", attempt)) if v is not None}
        body = self._client.request("GET", f"/v1/jobs/{self.id}/metrics", params=params).json()
        return [MetricPoint.model_validate(p) for p in body["points"]]

    def checkpoints(self) -> list[CheckpointInfo]:
        body = self._client.request("GET", f"/v1/jobs/{self.id}/checkpoints").json()
        return [CheckpointInfo.model_validate(c) for c in body["checkpoints"]]

    def samples(
        self,
        step: int | None = None,
        group: int | None = None,
        selected: str | None = None,
        limit: int = 20,
        cursor: str | None = None,
    ) -> SamplePage:
        """A page of the job's rollout traces (`traces` in the spec): sampled trajectories of its training
        steps, oldest first; `selected="worst"` keeps each group's worst; pass `next_cursor` to continue."""
        params = {"step": step, "group": group, "selected": selected, "limit": limit, "cursor": cursor}
        body = self._client.request(
            "GET", f"/v1/jobs/{self.id}/samples", params={k: v for k, v in params.items() if v is not None}
        ).json()
        return SamplePage.model_validate(body)

    def logs(self, since: int = 0, limit: int = 1000) -> LogPage:
        """Log lines the trainer reported after `since` (pass the page's `next` to continue)."""
        params = {"since": since, "limit": limit}
        return LogPage.model_validate(
            self._client.request("GET", f"/v1/jobs/{self.id}/logs", params=params).json()
        )

    def driver_log(self, attempt: int | None = None) -> str:
        """The Ray driver's stdout/stderr (tracebacks land here)."""
        params: dict[str, Any] = {"source": "driver"}
        if attempt is not None:
            params["attempt"] = attempt
        return self._client.request("GET", f"/v1/jobs/{self.id}/logs", params=params).text

    def stream(self, since: int = 0, follow: bool = True, reconnects: int = 10) -> Iterator[JobEvent]:
        """The job's events as they happen (server-sent events), until the job has ended.

        A dropped connection is resumed from the last event seen (Last-Event-ID), up to `reconnects`
        times in a row, so no event is lost or repeated. A stream the server ends at its lifetime (its
        `retry:` hint) is resumed the same way and is not counted as a failure.
        """
        last = since
        failures = 0
        while True:
            reconnect_ms: str | None = None
            try:
                for event_type, data, seq in _parse_sse(
                    self._client.stream_lines(
                        f"/v1/jobs/{self.id}/events",
                        {"since": last, "follow": str(follow).lower()},
                        {"Last-Event-ID": str(last), "Accept": "text/event-stream"},
                    )
                ):
                    failures = 0
                    if event_type == "end":
                        self.refresh()
                        return
                    if event_type == _RECONNECT and seq is None:
                        reconnect_ms = data
                        break
                    event = JobEvent.model_validate_json(data)
                    last = seq if seq is not None else event.seq
                    yield event
                error: Exception = Unavailable("the server closed the stream before the job ended")
            except (httpx.TransportError, Unavailable) as e:
                error = e
            if reconnect_ms is not None:  # the server ended the stream at its lifetime: not a failure
                time.sleep(min(int(reconnect_ms), 60_000) / 1000)
                continue
            failures += 1
            if failures > reconnects:
                raise Unavailable(f"event stream of job {self.id} lost: {error}") from error
            self._client._sleep_before_retry(failures - 1)


_RECONNECT = "retry"  # what _parse_sse yields for a `retry:` field without data: reconnect after that many ms


def _parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, str, int | None]]:
    """(event type, data, id) per server-sent event; comment lines (keep-alives) are skipped. A block with
    only a `retry:` field (the server's hint before it ends the stream) yields (_RECONNECT, ms, None)."""
    event_type, data, seq, retry = "message", list[str](), None, None
    for line in lines:
        if line == "":
            if data:
                yield event_type, "\n".join(data), seq
            elif retry is not None:
                yield _RECONNECT, retry, None
            event_type, data, seq, retry = "message", list[str](), None, None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event_type = value
        elif name == "data":
            data.append(value)
        elif name == "id" and value.isdigit():
            seq = int(value)
        elif name == "retry" and value.isdigit():
            retry = value
    if data:
        yield event_type, "\n".join(data), seq
