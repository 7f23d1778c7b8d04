"""What the trainer writes and the control plane reads back: checkpoint names, and JSON that is safe to send."""

from __future__ import annotations

import math
import re
from typing import Any

_CHECKPOINT = re.compile(r"step_(\d+)", re.ASCII)


def checkpoint_name(step: int) -> str:
    return f"step_{step}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint directory name (`step_N`), else None."""
    m = _CHECKPOINT.fullmatch(name)
    return int(m.group(1)) if m else None


def json_safe(v: Any, depth: int = 0) -> Any:
    """Plain JSON values only: non-finite floats become null (JSON has no NaN, and a diverged loss must not
    break reporting), other objects become strings, and nesting stops at 16 levels."""
    if depth > 16:
        return str(v)
    if isinstance(v, dict):
        return {str(k): json_safe(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [json_safe(x, depth + 1) for x in v]
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if v is None or isinstance(v, bool | int | str):
        return v
    return str(v)
