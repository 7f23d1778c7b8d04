"""Step-constant normalisers: what a learner passes when one optimizer step is split up.

A normaliser computed per micro-batch or per rank is not constant across the members of a group that
land in different micro-batches, which breaks cancellation (docs/objectives.md#step-constant-normalisers). A learner
that splits a step computes `StepNorm` once for the whole step (summed over micro-batches and ranks)
and passes it to every `Objective.loss` call; the micro-batch losses then sum to the full-batch loss.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepNorm:
    """Totals of one optimizer step.

    tokens: active response tokens of the whole step (the N_tok of aggregation `token_mean`).
    sequences: responses in the whole step (the N_seq of the `seq_mean_*` and `constant` aggregations).
    length: padded length of the step, used as L by aggregation `constant` when `const_length` is unset;
        pass the generation budget if micro-batches are padded to different lengths.
    group_size: responses per group; when given, objectives with a group transform (DFPO) check that
        each call holds whole groups.
    """

    tokens: float
    sequences: int
    length: int
    group_size: int | None = None

    def __post_init__(self) -> None:
        if not self.tokens > 0:
            raise ValueError(f"StepNorm.tokens must be > 0 (active tokens of the step), got {self.tokens!r}")
        if not (isinstance(self.sequences, int) and self.sequences >= 1):
            raise ValueError(f"StepNorm.sequences must be an int >= 1, got {self.sequences!r}")
        if not (isinstance(self.length, int) and self.length >= 1):
            raise ValueError(f"StepNorm.length must be an int >= 1, got {self.length!r}")
        if self.group_size is not None and not (isinstance(self.group_size, int) and self.group_size >= 1):
            raise ValueError(f"StepNorm.group_size must be None or an int >= 1, got {self.group_size!r}")

    @classmethod
    def from_mask(cls, mask: Any, group_size: int | None = None) -> StepNorm:
        """From the response mask (B, T) of the whole step (all micro-batches of this process)."""
        if getattr(mask, "ndim", None) != 2:
            raise ValueError(
                f"StepNorm.from_mask: mask must be (B, T), got shape {tuple(getattr(mask, 'shape', ()))}"
            )
        return cls(
            tokens=float(mask.sum()),
            sequences=int(mask.shape[0]),
            length=int(mask.shape[1]),
            group_size=group_size,
        )

    @classmethod
    def combine(cls, parts: Iterable[StepNorm]) -> StepNorm:
        """Totals of several parts (micro-batches, or ranks after gathering): sums, max length."""
        parts = list(parts)
        if not parts:
            raise ValueError("StepNorm.combine needs at least one part")
        sizes = {p.group_size for p in parts}
        if len(sizes) > 1:
            raise ValueError(f"StepNorm.combine: parts disagree on group_size: {sorted(sizes, key=str)}")
        return cls(
            tokens=sum(p.tokens for p in parts),
            sequences=sum(p.sequences for p in parts),
            length=max(p.length for p in parts),
            group_size=parts[0].group_size,
        )
