"""Python SDK of the tgc-rl control plane: `Client(url, token)`, `Job`, typed errors.

Needs only httpx, pydantic and pyyaml (no torch, no Ray, nothing of the server): it imports only the wire
layer (`tgc_rl.wire`, `tgc_rl.run_layout`), and the client distribution (clients/) ships just these:

    from tgc_rl.sdk import Client
    job = Client("http://127.0.0.1:8080", token).submit("job.yaml")
    job.wait(timeout=600)
"""

from tgc_rl.sdk.client import Client, spec_to_dict
from tgc_rl.sdk.errors import (
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    RateLimited,
    ServerError,
    TgcError,
    TooLarge,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from tgc_rl.sdk.job import Job
from tgc_rl.wire import (
    CheckpointInfo,
    DatasetRecord,
    JobEvent,
    JobRecord,
    JobState,
    LogLine,
    LogPage,
    MetricPoint,
    SamplePage,
    TraceRecord,
)

__all__ = [
    "CheckpointInfo",
    "Client",
    "Conflict",
    "DatasetRecord",
    "Forbidden",
    "Invalid",
    "Job",
    "JobEvent",
    "JobRecord",
    "JobState",
    "LogLine",
    "LogPage",
    "MetricPoint",
    "NotFound",
    "RateLimited",
    "SamplePage",
    "ServerError",
    "TgcError",
    "TooLarge",
    "TraceRecord",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "spec_to_dict",
]
