"""The job spec's shared parts: hard limits, the strict base model, bounded free-form values, entry points."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
)

from tgc_rl.tasks.registry import GYM_PREFIX

# Hard limits a submitted spec must respect (the control plane enforces them; the trainer too).
MAX_STEPS = 1_000_000
MAX_GROUP_SIZE = 256
MAX_PROMPTS_PER_STEP = 4096
MAX_NEW_TOKENS = 131_072
MAX_REPLICAS = 1024
MAX_SEED = 2**32 - 1  # numpy's and vLLM's seed range
MAX_FREE_FORM_DEPTH = 8
MAX_RANDOM_MODEL_PARAMS = 2_000_000_000  # `random` models are for tests and benchmarks


class _Strict(BaseModel):
    # allow_inf_nan=False: JSON bodies may carry NaN/Infinity (Python's json reads them); no field takes one
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def check_free_form(value: Any, path: str) -> None:
    """Refuse what a free-form mapping must never hold, before anything else walks it: nesting deeper than
    MAX_FREE_FORM_DEPTH, non-finite numbers, integers beyond 64 bits, non-string keys, non-JSON values.

    Iterative (an explicit stack), so a value nested thousands of levels deep cannot exhaust the stack.
    """
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth >= MAX_FREE_FORM_DEPTH:
                raise ValueError(
                    f"{path}: nested deeper than {MAX_FREE_FORM_DEPTH} levels (at {where}); flatten it"
                )
            if isinstance(v, dict):
                for k, x in v.items():
                    if not isinstance(k, str):
                        raise ValueError(f"{where}: keys must be strings")
                    stack.append((x, f"{where}.{k}", depth + 1))
            else:
                stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{where}: {v} is not a finite number")
        elif isinstance(v, int) and not isinstance(v, bool):
            if not -(2**63) <= v < 2**63:
                raise ValueError(f"{where}: integer out of the 64-bit range")
        elif v is not None and not isinstance(v, str | bool):
            raise ValueError(f"{where}: must hold plain JSON values (numbers, strings, lists, mappings)")


def _free_form(path: str):
    """A `mode="before"` validator running check_free_form on a free-form mapping field."""

    def check(cls, v: Any) -> Any:
        if isinstance(v, dict):
            check_free_form(v, path)
        return v

    return classmethod(check)


BUILTIN_MODEL_SOURCES = frozenset({"smollm2-135m-instruct", "random"})
# fullmatch, never `$` with match: `$` also matches before a trailing newline
_ENTRY_POINT = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)


def is_entry_point(value: str) -> bool:
    """`package.module:function` syntax (the module is imported where the job runs, not here)."""
    return bool(_ENTRY_POINT.fullmatch(value)) and not value.startswith(GYM_PREFIX)
