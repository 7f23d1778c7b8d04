"""Transforms of weights and advantages: DFPO Min-Replace / Orth, Advantage Reweighting, Lopti stages."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlcore.groups import GroupIndex


def min_replace(v: Tensor, groups: GroupIndex) -> Tensor:
    """v_i <- min_{j in g(i)} v_j, DFPO Min-Replace (arXiv 2604.13088 v1 Eq. 17), under stop-gradient."""
    return groups.amin(v.detach())[groups.inverse]


def orth(v: Tensor, adv: Tensor, groups: GroupIndex) -> Tensor:
    """v <- v - (A.v / |A|^2) A per group, DFPO Adv-Orthogonal (arXiv 2604.13088 v1 Eq. 18)."""
    v, adv = v.detach(), adv.detach()
    dot = groups.sum(adv * v)
    norm = groups.sum(adv * adv)
    coef = torch.where(norm > 0, dot / norm.clamp_min(torch.finfo(norm.dtype).tiny), torch.zeros_like(dot))
    return v - coef[groups.inverse] * adv


def advantage_reweighting(old_logprobs: Tensor, alpha: float) -> Tensor:
    """AR factor alpha * pi_old + (1 - alpha), node-local (arXiv 2505.12929; code `both_linear_normal`)."""
    return torch.exp(old_logprobs).mul_(alpha).add_(1.0 - alpha)


def lopti_stages(old_logprobs: Tensor, mask: Tensor, eta: float) -> list[Tensor]:
    """Lopti token masks in update order (arXiv 2505.12929): split by pi_old < |eta|; eta>0: low first."""
    active = mask if mask.dtype == torch.bool else mask != 0
    if eta == 0:
        return [active]
    low = old_logprobs < math.log(abs(eta))
    first, second = (low, ~low) if eta > 0 else (~low, low)
    return [active & first, active & second]
