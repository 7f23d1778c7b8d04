"""Trust-region gates: PPO's sign-dependent clip, dual clip, the symmetric gate, GMPO's log-space clip.

All ratio gates are one `clamp` of the ratio between per-response bounds chosen by sign(A):

    PPO  (arXiv 1707.06347 Eq. 7)  max(-rA, -clip(r)A) = -A * clamp(r, lo_A, hi_A), with
         A>0: [0, 1+eps_h]   A<0: [1-eps_l, inf]   (dual clip, arXiv 1912.09729: A<0: [1-eps_l, c])
    symmetric gate                [1-eps_l, 1+eps_h] for every copy, whatever the sign (docs/objectives.md#sign-dependent-clipping)

clamp passes the gradient exactly where the token is live, so autograd gives the closed-form weights
with fewer (B, T) temporaries than the textbook max/min form. `clipped` marks tokens whose gradient
the gate removed (diagnostic D10).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlcore.config import ObjectiveConfig


def ratio_bounds(adv: Tensor, cfg: ObjectiveConfig) -> tuple[Tensor, Tensor] | tuple[float, float]:
    """(lo, hi) clamp bounds of the ratio for each row/token of `adv` (scalars for the symmetric gate)."""
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    if cfg.gate == "symmetric":
        return lo, hi
    top = cfg.dual_clip_c if cfg.gate == "dual" else math.inf
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    lower = torch.where(adv < 0, zero + lo, zero)  # A=0 rows: unbounded, they carry no gradient anyway
    upper = torch.where(adv > 0, zero + hi, torch.where(adv < 0, zero + top, zero + math.inf))
    return lower, upper


def gate_ratio(ratio: Tensor, adv: Tensor, cfg: ObjectiveConfig) -> tuple[Tensor, Tensor | None]:
    """The gated ratio (value clamp(r), gradient r on live tokens, 0 elsewhere) and the clipped mask.

    `adv` only supplies signs; (B, 1) advantages keep the bounds per row (no (B, T) bound tensors)."""
    if cfg.gate == "none":
        return ratio, None
    gated = ratio.clamp(*ratio_bounds(adv, cfg))
    return gated, gated.detach() != ratio.detach()


def gate_mask(ratio: Tensor, adv: Tensor, cfg: ObjectiveConfig) -> Tensor | None:
    """Live-token mask of the gate for stop-gradient coefficients (same decisions as `gate_ratio`)."""
    if cfg.gate == "none":
        return None
    lower, upper = ratio_bounds(adv, cfg)
    return (ratio >= lower) & (ratio <= upper)


def log_space_clip(logr: Tensor, adv: Tensor, cfg: ObjectiveConfig) -> tuple[Tensor, Tensor | None]:
    """GMPO's token clip of log r to [-clip_low, clip_high] (arXiv 2507.20673 Eq. 6; verl `geo_mean`).

    gate `ppo`: sign-dependent (A>0 clipped above, A<0 below); `symmetric`: both sides for every copy.
    """
    if cfg.gate == "none":
        return logr, None
    if cfg.gate == "symmetric":
        clipped_logr = logr.clamp(-cfg.clip_low, cfg.clip_high)
    else:
        zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
        lower = torch.where(adv < 0, zero - cfg.clip_low, zero - math.inf)
        upper = torch.where(adv > 0, zero + cfg.clip_high, zero + math.inf)
        clipped_logr = logr.clamp(lower, upper)
    return clipped_logr, clipped_logr.detach() != logr.detach()
