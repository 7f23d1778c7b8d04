"""Loss aggregation as per-response coefficients c_i, built from step-constant totals.

The loss is sum_i c_i sum_t term[i,t]; c_i is response-coupled only for GRPO's seq_mean_token_mean
(docs/objectives.md#length-normalisation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcore.config import ObjectiveConfig
from rlcore.step import StepNorm


def step_totals(step: StepNorm | None, lengths: Tensor, width: int) -> tuple[float | Tensor, int, int]:
    """(N_tok, N_seq, L) of the whole step: from `step`, else from this call's own batch."""
    if step is None:
        return lengths.sum(), int(lengths.shape[0]), width
    if not isinstance(step, StepNorm):
        raise ValueError(f"step: expected rlcore.StepNorm, got {type(step).__name__}")
    n_tok = float(lengths.sum())
    if step.tokens < n_tok - 1e-3 or step.sequences < lengths.shape[0]:
        raise ValueError(
            f"step: StepNorm(tokens={step.tokens}, sequences={step.sequences}) is smaller than this "
            f"call ({n_tok:g} tokens, {lengths.shape[0]} sequences); it must hold the totals of the "
            "whole optimizer step (all micro-batches and ranks)"
        )
    return step.tokens, step.sequences, step.length


def sequence_coefficients(cfg: ObjectiveConfig, lengths: Tensor, step: StepNorm | None, width: int) -> Tensor:
    """c_i (B,) such that the loss is sum_i c_i sum_t term[i,t]."""
    n_tok, n_seq, length = step_totals(step, lengths, width)
    if cfg.aggregation == "seq_mean_token_mean":  # GRPO 1/(G |o_i|), arXiv 2402.03300 Eq. 3
        return 1.0 / (n_seq * lengths.clamp_min(1))
    if cfg.aggregation == "token_mean":  # DAPO token-level loss, arXiv 2503.14476 Eq. 8
        scale = 1.0 / n_tok
    elif cfg.aggregation == "seq_mean_token_sum":
        scale = 1.0 / n_seq
    else:  # constant, Dr. GRPO arXiv 2503.20783 (G * L_max)
        scale = 1.0 / (n_seq * (cfg.const_length or length))
    return torch.ones_like(lengths) * scale
