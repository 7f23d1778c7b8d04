"""Importance weights of a token: token ratio, GSPO sequence ratio, GMPO geometric mean, CISPO truncation.

Sequence-level ratios act in the "GSPO-token" form (arXiv 2507.18071 sec. 4.3): every token of response
i carries the value s_i and a gradient of s_i with respect to its own log-prob, so the aggregation
decides the length normaliser (seq_mean_token_mean gives GSPO's s_i A_i / l_i exactly).
"""

from __future__ import annotations

import torch
from torch import Tensor

MAX_LOG_SEQ_RATIO = 10.0  # verl clamps the GSPO log sequence ratio at 10 against overflow


def token_ratio(logr: Tensor) -> Tensor:
    """r = pi/pi_old per token, with gradient (PPO/GRPO)."""
    return torch.exp(logr)


def sequence_log_ratio(logr: Tensor, mf: Tensor, lengths: Tensor) -> Tensor:
    """log s_i = mean over response tokens of log r (detached): (B,)."""
    num = (logr.detach() * mf).sum(1)
    return (num / lengths.clamp_min(1)).clamp(max=MAX_LOG_SEQ_RATIO)


def broadcast_with_token_grad(log_s: Tensor, logr: Tensor) -> Tensor:
    """Value s_i on every token of response i, gradient s_i * d logr/d logp (GSPO-token form)."""
    return torch.exp(log_s)[:, None] * torch.exp(logr - logr.detach())


def geo_mean_ratio(logr_clipped: Tensor, mf: Tensor, lengths: Tensor) -> Tensor:
    """GMPO's geometric mean of (log-space clipped) token ratios in token form (arXiv 2507.20673)."""
    return broadcast_with_token_grad(sequence_log_ratio(logr_clipped, mf, lengths), logr_clipped)


def truncated_weight(ratio: Tensor, is_min: float, is_max: float) -> Tensor:
    """CISPO's stop-gradient IS weight sg(clip(r, is_min, is_max)) (arXiv 2506.13585 Eq. 4)."""
    return ratio.detach().clamp(is_min, is_max)
