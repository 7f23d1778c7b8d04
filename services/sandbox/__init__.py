"""The code sandbox: bubblewrap namespaces + rlimits + a wall-clock deadline, and its HTTP endpoint."""

from services.sandbox.bwrap import SandboxUnavailable
from services.sandbox.executor import LANGUAGES, RunResult, Sandbox, SandboxError, SandboxMode
from services.sandbox.limits import SandboxLimits

__all__ = [
    "LANGUAGES",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxMode",
    "SandboxUnavailable",
]
