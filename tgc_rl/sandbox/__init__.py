"""The code sandbox: bubblewrap namespaces + rlimits + a wall-clock deadline, and its HTTP endpoint."""

from tgc_rl.sandbox.bwrap import SandboxUnavailable
from tgc_rl.sandbox.executor import LANGUAGES, RunResult, Sandbox, SandboxError, SandboxMode
from tgc_rl.sandbox.limits import SandboxLimits

__all__ = [
    "LANGUAGES",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxMode",
    "SandboxUnavailable",
]
