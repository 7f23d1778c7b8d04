"""Wire models of the REST API, shared by the control plane and the SDK: pydantic and the stdlib only, so the
client distribution (clients/) ships this module without the server or the trainer.

The job spec itself is `tgc_rl.config.JobSpec` (validated by the server, the trust boundary); these models wrap
it in records, pages and events. `TraceRecord` is also the line format of a run's `traces/` files.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tgc_rl.run_layout import JobState

__all__ = [
    "CancelRequest",
    "DatasetList",
    "DatasetRecord",
    "CheckpointInfo",
    "CheckpointList",
    "DryRunResult",
    "ErrorBody",
    "ErrorDetail",
    "EventAck",
    "EventBatch",
    "JobEvent",
    "JobList",
    "JobRecord",
    "JobState",
    "LogLine",
    "LogPage",
    "MetricPoint",
    "MetricSeries",
    "ResumeRequest",
    "SamplePage",
    "Selected",
    "TraceRecord",
    "TrainerEvent",
    "Transition",
]


Selected = Literal["best", "worst", "random", "group", "all"]


class TraceRecord(BaseModel):
    """One sampled trajectory of a training step, as the trainer stored it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    step: int = Field(ge=0, description="The optimizer step that trained on it.")
    group: int = Field(ge=0, description="Its group within the step (0-based).")
    index: int = Field(ge=0, description="Its index within the group (0-based).")
    prompt_index: int = Field(description="The prompt's position in the task's stream.")
    prompt: str
    response: str
    reward: float | None = Field(description="The verifier's reward (null: not finite).")
    advantage: float | None = Field(
        description="The advantage it was trained with (a per-token advantage: its mean over the response)."
    )
    status: str = Field(description="The verifier's status: ok, timeout or error.")
    detail: str = Field("", description="The verifier's detail (why a response scored as it did).")
    length: int = Field(ge=0, description="Response tokens.")
    finish_reason: str = Field(description="stop (end of sequence) or length (hit max_new_tokens).")
    policy_version: int = Field(description="The version of the weights that sampled it.")
    selected: list[Selected] = Field(
        description="Why it was kept: best/worst/random of its group, group, all."
    )
    truncated: bool = Field(
        False, description="The prompt or response text was cut to traces.max_text_chars."
    )
    logprobs: list[float | None] | None = Field(
        None, description="Each response token's sampling log-prob (traces.logprobs)."
    )

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.step, self.group, self.index)


class Transition(BaseModel):
    """One state change of a job, as stored."""

    state: JobState
    previous: JobState | None = Field(None, description="The state before (null for the first record).")
    reason: str = ""
    time: datetime
    attempt: int = Field(1, description="Attempt number; a resume starts a new attempt.")


class JobRecord(BaseModel):
    """A job as the control plane keeps it."""

    id: str
    name: str
    tenant: str = Field(description="Owner: the tenant of the token that submitted it.")
    state: JobState
    reason: str = Field("", description="Why the job is in its state (the last transition's reason).")
    spec: dict[str, Any] = Field(description="The validated job spec (JobSpec, with defaults filled in).")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempt: int = 1
    step: int | None = Field(None, description="Last step the trainer reported.")
    total_steps: int = Field(description="spec.steps")
    latest_metrics: dict[str, float | None] = Field(
        default_factory=dict, description="Metrics of the last reported step (non-finite values are null)."
    )
    cancel_requested: bool = False
    cancel_reason: str | None = None
    hard_stopped: bool = Field(
        False, description="True when the trainer missed the cancel grace period and Ray stopped it hard."
    )
    ray_submission_id: str | None = None
    driver_running: bool = Field(
        False,
        description="The attempt's Ray job still exists (it may outlive the record's end while it tears down).",
    )
    run_dir: str | None = Field(None, description="The current attempt's run directory on the cluster.")
    resume_from: str | None = Field(None, description="Checkpoint the current attempt resumes from.")
    transitions: list[Transition] = Field(default_factory=list)


class JobList(BaseModel):
    jobs: list[JobRecord]
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next (older) page.")


class DryRunResult(BaseModel):
    """Answer of `POST /v1/jobs?dry_run=true`: the spec is valid; nothing was stored."""

    valid: Literal[True] = True
    spec: dict[str, Any]


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("cancelled by user", max_length=1000)


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint: str | None = Field(
        None,
        max_length=4096,
        description="A checkpoint path from `GET /v1/jobs/{id}/checkpoints`, or `step_<N>`; "
        "default: the newest checkpoint of any attempt.",
    )
    reason: str = Field("resumed by user", max_length=1000)


class MetricPoint(BaseModel):
    step: int
    attempt: int
    time: datetime
    metrics: dict[str, float | None]


class MetricSeries(BaseModel):
    job_id: str
    points: list[MetricPoint]


class CheckpointInfo(BaseModel):
    step: int
    attempt: int
    path: str
    time: datetime
    exists: bool | None = Field(
        None, description="Whether the path exists where the control plane can see it (null: not visible)."
    )


class CheckpointList(BaseModel):
    job_id: str
    checkpoints: list[CheckpointInfo]


class SamplePage(BaseModel):
    """A page of a job's rollout traces (`traces` in the spec), in (step, group, index) order."""

    job_id: str
    samples: list[TraceRecord]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page; null: no more.")
    last_step: int | None = Field(None, description="The newest step with a stored sample (null: none yet).")


class LogLine(BaseModel):
    seq: int
    attempt: int
    time: datetime
    level: str = "info"
    message: str


class LogPage(BaseModel):
    job_id: str
    lines: list[LogLine]
    next: int = Field(description="Pass as `since` to get the lines after these.")


class JobEvent(BaseModel):
    """One entry of a job's event stream (the `data:` of a server-sent event; `id:` is `seq`)."""

    seq: int
    job_id: str
    attempt: int
    type: str = Field(description="`state`, `step`, `log`, `checkpoint`, or `end` (the stream is complete).")
    time: datetime
    data: dict[str, Any]


# -- trainer -> control plane ---------------------------------------------------------------------
MAX_EVENTS_PER_BATCH = 1000


class TrainerEvent(BaseModel):
    """An event the trainer reports; extra fields are kept. Known types: state, step, log, checkpoint."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(min_length=1, max_length=64)
    time: float


class EventBatch(BaseModel):
    events: list[TrainerEvent] = Field(max_length=MAX_EVENTS_PER_BATCH)


class EventAck(BaseModel):
    """The control plane's answer to a trainer report: whether to stop gracefully now."""

    cancel: bool
    reason: str | None = None


# -- errors ---------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    field: str = Field(description="Dotted path of the bad field, e.g. `sampling.max_new_tokens`.")
    msg: str
    type: str = ""


class ErrorBody(BaseModel):
    """Every error response has this shape."""

    error: str = Field(description="Machine-readable code: invalid, unauthorized, not_found, conflict, ...")
    message: str
    detail: list[ErrorDetail] = Field(default_factory=list)


class DatasetRecord(BaseModel):
    """An uploaded dataset; jobs refer to it by `id` (`task.params.dataset_id`)."""

    id: str = Field(description="`ds_` and 32 hex digits.")
    name: str = Field(description="The file name given at upload; its suffix is the format.")
    tenant: str
    format: str = Field(description="jsonl, parquet or csv.")
    size_bytes: int
    sha256: str = Field(
        description="SHA-256 of the file's bytes; the same tenant's identical upload is this one."
    )
    rows: int
    columns: list[str]
    created_at: datetime


class DatasetList(BaseModel):
    datasets: list[DatasetRecord]
