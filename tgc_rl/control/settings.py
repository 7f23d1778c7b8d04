"""Settings of one control-plane process; every field has a `TGC_<NAME>` environment variable."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tgc_rl import config as spec_limits

# the schema's own bounds of traces.max_total_bytes: the operator's cap may only be tighter
_TRACE_BOUNDS = spec_limits.TracesSpec.model_fields["max_total_bytes"].metadata
_TRACE_BYTES_GE = next(b.ge for b in _TRACE_BOUNDS if hasattr(b, "ge"))
_TRACE_BYTES_LE = next(b.le for b in _TRACE_BOUNDS if hasattr(b, "le"))


class ControlSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Field(
        Path("tgc-data"), description="Holds the SQLite database, run directories and the managed Ray head."
    )
    db_url: str | None = Field(
        None,
        description="SQLAlchemy URL; default: SQLite (WAL) at <data_dir>/tgc.db. PostgreSQL: postgresql://...",
    )
    runs_dir: Path | None = Field(
        None,
        description="Run directories as the Ray workers see them (shared storage); default <data_dir>/runs.",
    )
    ray_address: str = Field(
        "local",
        description="`local`: start (or reuse) a Ray head managed under data_dir; an http(s) URL: the Ray "
        "dashboard / Jobs API of an existing cluster (e.g. a KubeRay head service); `none`: no Ray "
        "(API only: jobs stay queued until a scheduler with Ray picks them up).",
    )
    ray_auth_token: str | None = Field(
        None,
        description="Ray auth token of an existing cluster run with RAY_AUTH_MODE=token (also: RAY_AUTH_TOKEN).",
    )
    ray_num_cpus: int = Field(8, ge=1, description="Logical CPUs of the managed local Ray head.")
    ray_object_store_bytes: int = Field(
        512 * 2**20, ge=78 * 2**20, description="Managed head's object store."
    )
    scheduler: bool = Field(True, description="Run the scheduler (admission, Ray monitoring, cancel grace).")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    public_url: str | None = Field(
        None, description="URL the trainers use to report back; default http://<host>:<port>."
    )
    trainer_python: str = Field(
        sys.executable, description="Python that runs `-m tgc_rl.trainer` on the cluster."
    )
    trainer_env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables for the trainer (runtime_env env_vars).",
    )
    default_max_concurrent_jobs: int = Field(
        2, ge=0, description="Per-tenant limit on starting+running jobs unless the tenant has its own."
    )
    cancel_grace_s: float = Field(
        120.0, gt=0, description="After a cancel, how long the trainer has to stop before Ray stops it hard."
    )
    poll_interval_s: float = Field(1.0, gt=0, description="Scheduler period.")
    sse_poll_s: float = Field(0.3, gt=0, description="How often an event stream looks for new events.")
    max_body_bytes: int = Field(1 * 2**20, ge=1024, description="Largest accepted request body.")
    # Server-side spec limits (may be tighter than the schema's MAX_* constants).
    max_steps: int = Field(spec_limits.MAX_STEPS, ge=1, le=spec_limits.MAX_STEPS)
    max_replicas: int = Field(
        64, ge=1, le=spec_limits.MAX_REPLICAS, description="Max learner ranks + rollout replicas of one job."
    )
    max_new_tokens: int = Field(spec_limits.MAX_NEW_TOKENS, ge=1, le=spec_limits.MAX_NEW_TOKENS)
    max_samples_per_step: int = Field(
        65_536, ge=1, description="Max group_size * prompts_per_step of one job."
    )
    max_free_form_bytes: int = Field(
        64 * 1024,
        ge=256,
        description="Max JSON size of each free-form mapping (config_overrides, params, ...).",
    )
    max_trace_bytes: int = Field(
        _TRACE_BYTES_LE,
        ge=_TRACE_BYTES_GE,
        le=_TRACE_BYTES_LE,
        description="Most rollout-trace bytes one job may keep (its spec's traces.max_total_bytes); a spec "
        "asking for more is refused with 422. Below the spec's default (64 MiB), tenants must set it.",
    )
    allow_custom_code: bool = Field(
        False,
        description="Let non-admin tenants name their own code (`module:function` tasks/rewards, local model "
        "paths). Admin tokens always may.",
    )

    allow_unsafe_sandbox: bool = Field(
        False,
        description="Let non-admin tenants' jobs run model-written code WITHOUT the bubblewrap sandbox when their "
        "spec asks (`task.params.sandbox: unsafe_local`). Only for a server whose every tenant is trusted.",
    )
    datasets_dir: Path | None = Field(
        None,
        description="Uploaded datasets as the Ray workers see them (shared storage); default <data_dir>/datasets.",
    )
    max_dataset_bytes: int = Field(
        256 * 2**20, ge=1024, description="Largest dataset upload (POST /v1/datasets)."
    )
    # What one dataset upload may cost (docs/security.md#dataset-uploads); quotas: 0 turns one off.
    dataset_max_rows: int = Field(1_000_000, ge=1, description="Rows of one dataset file.")
    dataset_max_columns: int = Field(
        256, ge=1, description="Columns of one dataset file (JSONL: distinct keys)."
    )
    dataset_max_decoded_bytes: int = Field(
        2**30, ge=2**20, description="Decoded size of one dataset file (its text plus 8 bytes a cell)."
    )
    dataset_max_expansion: int = Field(
        64, ge=1, description="Decoded bytes per byte of file beyond the first 64 MiB (compression bombs)."
    )
    dataset_inspect_cpu_s: int = Field(
        30, ge=1, description="CPU seconds of the child that inspects an upload."
    )
    dataset_inspect_memory_mb: int = Field(
        1024, ge=512, description="Address space (RLIMIT_AS) of the inspecting child; pyarrow takes ~350 MiB."
    )
    dataset_inspect_concurrency: int = Field(2, ge=1, description="Uploads inspected at once, server-wide.")
    dataset_inspect_queue_s: float = Field(
        10.0, ge=0, description="How long an upload waits for an inspection slot; then 503 with Retry-After."
    )
    dataset_uploads_per_tenant: int = Field(
        2, ge=0, description="Uploads one tenant may have in progress at once; beyond it 429."
    )
    dataset_quota_count: int = Field(100, ge=0, description="Datasets one tenant may keep; beyond it 409.")
    dataset_quota_bytes: int = Field(
        8 * 2**30, ge=0, description="Bytes of datasets one tenant may keep; beyond it 409."
    )
    dataset_staging_max_age_s: float = Field(
        3600.0, gt=0, description="An upload's staging folder untouched this long is removed (a crash's)."
    )
    data_root: Path | None = Field(
        None,
        description="A directory on the workers under which tenants' specs may name files "
        "(`task.params.file`, relative); unset: only uploaded datasets (`dataset_id`).",
    )
    allowed_custom_resources: list[str] = Field(
        default_factory=list,
        description="Ray custom resources (node labels such as a GPU pool's) that non-admin tenants may ask for in "
        "resources.learner_custom_resources / rollout_custom_resources; others need an admin token. JSON list.",
    )
    # Per-tenant limits and slow clients (docs/security.md#per-tenant-limits); 0 turns a limit off.
    max_queued_jobs: int = Field(
        100,
        ge=0,
        description="Per-tenant limit on queued jobs (not started yet); beyond it a submission "
        "or resume is refused with 429. 0: no limit.",
    )
    rate_limit_per_s: float = Field(
        20.0,
        ge=0,
        description="Requests a second per API token, on average (token bucket); beyond it 429 "
        "with Retry-After. Health probes, /metrics and trainer reports are not counted. 0: no limit.",
    )
    rate_limit_burst: int = Field(100, ge=1, description="Requests an idle API token may send at once.")
    max_streams_per_tenant: int = Field(
        8, ge=1, description="Event streams (GET /v1/jobs/{id}/events) one tenant may hold open at once."
    )
    stream_max_s: float = Field(
        3600.0, gt=0, description="An event stream ends after this long (clients resume with Last-Event-ID)."
    )
    stream_reauth_s: float = Field(
        30.0, gt=0, description="How often an open event stream checks that its token is still valid."
    )
    job_retention_s: float = Field(
        0.0,
        ge=0,
        description="Ended jobs older than this (since they ended) are deleted with their run "
        "directory under runs_dir. 0: kept until the count limit.",
    )
    max_ended_jobs_per_tenant: int = Field(
        10_000,
        ge=0,
        description="Per tenant, only this many of the most recently ended jobs are kept (with "
        "their run directories); older ones are deleted. 0: no count limit.",
    )
    retention_sweep_s: float = Field(300.0, gt=0, description="How often retention is applied.")
    keep_alive_s: int = Field(5, ge=1, description="An idle keep-alive connection is closed after this.")
    client_header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection whose request headers have not all arrived this long after "
        "its first byte (or after it opened) is closed.",
    )
    client_body_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A request whose body has not fully arrived this long after its headers "
        "is answered 408 (a 256 MiB upload needs ~0.9 MB/s).",
    )
    metrics_token: str | None = Field(
        None,
        min_length=16,
        description="Bearer token that Prometheus sends to read /metrics (admin tokens may "
        "too). Unset: /metrics needs an admin token.",
    )

    @model_validator(mode="after")
    def _defaults(self) -> ControlSettings:
        if self.runs_dir is None:
            self.runs_dir = self.data_dir / "runs"
        if self.datasets_dir is None:
            self.datasets_dir = self.data_dir / "datasets"
        if self.ray_auth_token is None:
            self.ray_auth_token = os.environ.get("RAY_AUTH_TOKEN") or None
        return self

    @property
    def datasets_path(self) -> Path:
        """datasets_dir once the defaults are filled in (never None then)."""
        return self.datasets_dir or self.data_dir / "datasets"

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{(self.data_dir / 'tgc.db').resolve()}"

    @property
    def control_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def from_env(cls, **overrides: Any) -> ControlSettings:
        """Fields from `TGC_<FIELD>` variables, then the explicit overrides (None means unset)."""
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = os.environ.get(f"TGC_{name.upper()}")
            if raw is not None and raw != "":
                values[name] = raw
        import json

        for name in ("trainer_env", "allowed_custom_resources"):  # JSON in the environment
            if name in values:
                values[name] = json.loads(values[name])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
