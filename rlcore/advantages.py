"""Group-relative advantages: baseline, scale and reward shaping before centring
(docs/objectives.md#group-relative-advantages)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlcore.config import ObjectiveConfig
from rlcore.groups import GroupIndex
from rlcore.validation import check_finite, check_group_ids, check_tensor

Shaping = Callable[[Tensor, Tensor], Tensor]


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    cfg: ObjectiveConfig,
    *,
    bonus: Tensor | None = None,
    shaping: Shaping | None = None,
    keep: Tensor | None = None,
) -> Tensor:
    """(B,) advantages of the whole step; call it once per step, before any micro-batch split.

    bonus: (B,) added to the rewards as `cfg.bonus_coef * bonus` before centring (IBPO-style, arXiv 2605.16302).
    shaping: f(rewards, group_ids) -> rewards, also applied before centring (e.g. DAPO overlong penalty).
    Every response must have at least one active token, groups must hold >= 2 responses and all the same
    number: drop or refill incomplete groups first, so each group is centred over the responses that
    enter the loss (masking a response after centring would leave its group's sum != 0).
    keep: (B,) bool, the responses that enter the centring (e.g. ~truncated: filtering overlong responses
    before centring). The group is recentred, and scaled, over its kept responses; the others get A = 0, so
    they carry no policy gradient and every group still sums to 0 (a group with fewer than 2 kept: all 0).
    """
    rewards = _check_rewards(rewards)
    batch = rewards.shape[0]
    group_ids = check_group_ids(group_ids, batch)
    check_tensor("mask", mask, ndim=2, kind="mask")
    if mask.shape[0] != batch:
        raise ValueError(f"mask: expected {batch} rows (one per reward), got shape {tuple(mask.shape)}")
    lengths = mask.sum(1, dtype=rewards.dtype)
    empty = (lengths <= 0).nonzero().flatten()
    if empty.numel():
        raise ValueError(
            f"mask: response(s) {empty[:5].tolist()} have no active tokens; remove dropped "
            "responses from the batch before computing advantages"
        )
    if bonus is not None:
        check_tensor("bonus", bonus, (batch,))
        check_finite("bonus", bonus)
        rewards = rewards + cfg.bonus_coef * bonus.to(rewards.dtype)
    if shaping is not None:
        shaped = shaping(rewards, group_ids)
        check_tensor("shaping(rewards, group_ids)", shaped, (batch,))
        check_finite("shaping(rewards, group_ids)", shaped)
        rewards = shaped.to(rewards.dtype)

    groups = GroupIndex.of(group_ids)
    _check_group_sizes(groups)
    if keep is not None:
        return _kept_advantages(rewards, groups, lengths, cfg, _check_keep(keep, batch))
    size = groups.counts.to(rewards.dtype)[groups.inverse]
    centred = rewards - groups.mean(rewards)[groups.inverse]
    if cfg.adv_baseline == "loo":  # R_i - mean_{j!=i} R_j = G/(G-1) (R_i - mean), RLOO arXiv 2402.14740
        adv = centred * size / (size - 1)
    else:
        adv = centred
    if cfg.adv_scale == "group_std":  # unbiased std as in verl/TRL
        std = (groups.sum(centred * centred) / (groups.counts.to(rewards.dtype) - 1)).sqrt()
        adv = adv / (std[groups.inverse] + cfg.adv_eps)
    elif cfg.adv_scale in ("batch_std", "batch_whiten"):  # token-weighted, verl masked_whiten
        mean = (lengths * adv).sum() / lengths.sum()
        var = (lengths * (adv - mean) ** 2).sum() / (lengths.sum() - 1).clamp_min(1)
        if cfg.adv_scale == "batch_whiten":
            adv = adv - mean  # breaks cancellation; kept to reproduce verl's REINFORCE++-baseline
        adv = adv / (var.sqrt() + cfg.adv_eps)
    return adv


def _kept_advantages(
    rewards: Tensor, groups: GroupIndex, lengths: Tensor, cfg: ObjectiveConfig, keep: Tensor
) -> Tensor:
    """`group_advantages` over the kept responses of each group (the same formulas on the kept rows); 0 for
    the others and for groups with fewer than 2 kept."""
    kf = keep.to(rewards.dtype)
    count = groups.sum(kf)  # kept responses per group
    live = kf * (count >= 2).to(rewards.dtype)[groups.inverse]  # rows that carry an advantage
    n = count.clamp_min(2)  # groups with < 2 kept are zeroed by `live`; avoids 0/0
    centred = (rewards - (groups.sum(rewards * kf) / count.clamp_min(1))[groups.inverse]) * live
    size = n[groups.inverse]
    adv = centred * size / (size - 1) if cfg.adv_baseline == "loo" else centred
    if cfg.adv_scale == "group_std":
        std = (groups.sum(centred * centred) / (n - 1)).sqrt()
        adv = adv / (std[groups.inverse] + cfg.adv_eps)
    elif cfg.adv_scale in ("batch_std", "batch_whiten"):  # token-weighted over the live responses
        weight = lengths * live
        mean = (weight * adv).sum() / weight.sum().clamp_min(1)
        var = (weight * (adv - mean) ** 2).sum() / (weight.sum() - 1).clamp_min(1)
        if cfg.adv_scale == "batch_whiten":
            adv = (adv - mean) * live
        adv = adv / (var.sqrt() + cfg.adv_eps)
    return adv


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """(B,) DAPO's soft overlong penalty (arXiv 2503.14476, overlong reward shaping) of responses of `lengths` tokens: 0 up to
    max_len - buffer, then falling linearly to -factor at max_len (and -factor beyond). Add it to the rewards
    before centring (`advantages(..., bonus=)` or `overlong_shaping`), never after: shaping before centring
    keeps every group's advantages summing to 0, so cancellation holds."""
    if not 0 < buffer <= max_len:
        raise ValueError(f"buffer: must be in (0, max_len={max_len}], got {buffer}")
    check_tensor("lengths", lengths, ndim=1, kind="mask")
    over = (lengths.to(torch.float64) - (max_len - buffer)).clamp(min=0) / buffer
    return -factor * over.clamp(max=1.0)


def overlong_shaping(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Shaping:
    """A `Shaping` adding `overlong_penalty` to the rewards before centring."""
    penalty = overlong_penalty(lengths, max_len, buffer, factor)
    return lambda rewards, _group_ids: rewards + penalty.to(rewards.dtype)


def _check_keep(keep: object, batch: int) -> Tensor:
    k = check_tensor("keep", keep, (batch,), kind="mask")
    return k if k.dtype == torch.bool else k != 0


def _check_rewards(rewards: object) -> Tensor:
    r = check_tensor("rewards", rewards, ndim=1, kind="mask")
    if not r.is_floating_point():  # 0/1 integer or bool rewards are common; use float32 math
        r = r.to(torch.float32)
    if r.shape[0] == 0:
        raise ValueError("rewards: empty batch; pass at least one group of responses")
    check_finite("rewards", r)
    return r


def _check_group_sizes(groups: GroupIndex) -> None:
    small = groups.counts < 2
    if bool(small.any()):
        bad = groups.ids[small][:5].tolist()
        raise ValueError(
            f"group_ids: group(s) {bad} have a single response; group-relative advantages need "
            "at least 2 responses per group"
        )
    if groups.n > 1 and bool((groups.counts != groups.counts[0]).any()):
        raise ValueError(
            f"group_ids: groups must all have the same size, got sizes ({groups.describe_sizes()}); "
            "drop or refill incomplete groups before computing advantages"
        )
