"""Learning-rate schedule: linear warm-up, then constant, cosine or linear decay to zero at the last step."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the learner imports without pydantic
    from tgc_rl.config import OptimSpec


def lr_factor(step: int, optim: OptimSpec, total_steps: int) -> float:
    """Multiplier of optim.lr for optimizer step `step` (0-based) of `total_steps`."""
    warmup = optim.warmup_steps
    if step < warmup:
        return (step + 1) / (warmup + 1)  # never 0: the first step already moves
    if optim.schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    if optim.schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
