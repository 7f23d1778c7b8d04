"""Group advantages: baselines, scales, shaping before centring, and their input checks."""

from __future__ import annotations

import pytest
import torch

import rlcore

GIDS = torch.tensor([4, 4, 4, 4, 9, 9, 9, 9])
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0])
MASK = torch.ones(8, 5, dtype=torch.bool)


def adv(name="grpo", rewards=REWARDS, mask=MASK, **kw):
    return rlcore.get_objective(name, **kw).advantages(rewards, GIDS, mask)


def test_grpo_advantage_is_group_zscore_with_unbiased_std():
    a = adv()
    r = REWARDS.view(2, 4)
    want = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)
    torch.testing.assert_close(a, want.flatten())


def test_dr_grpo_advantage_is_mean_centred_only():
    r = REWARDS.view(2, 4)
    torch.testing.assert_close(adv("dr_grpo"), (r - r.mean(1, keepdim=True)).flatten())


def test_rloo_advantage_uses_the_leave_one_out_mean():
    r = REWARDS.view(2, 4)
    loo = (r.sum(1, keepdim=True) - r) / 3
    torch.testing.assert_close(adv("rloo"), (r - loo).flatten())


@pytest.mark.parametrize("name", rlcore.list_objectives())
def test_every_preset_centres_advantages_within_groups(name):
    sums = torch.zeros(2).index_add_(0, (GIDS == 9).long(), adv(name))
    torch.testing.assert_close(sums, torch.zeros(2), atol=1e-5, rtol=0)


def test_batch_std_scales_by_the_token_weighted_std_without_shifting():
    mask = torch.arange(5)[None, :] < torch.tensor([1, 2, 3, 4, 5, 5, 2, 1])[:, None]
    a = adv("reinforce_pp_baseline", mask=mask)
    centred = adv("dr_grpo", mask=mask)
    ratio = a / torch.where(centred == 0, torch.ones_like(centred), centred)
    nonzero = centred != 0
    assert torch.allclose(ratio[nonzero], ratio[nonzero][0].expand(int(nonzero.sum())))  # one common scale
    lengths = mask.sum(1).float()
    mean = (lengths * centred).sum() / lengths.sum()
    std = ((lengths * (centred - mean) ** 2).sum() / (lengths.sum() - 1)).sqrt()
    torch.testing.assert_close(ratio[nonzero][0], 1 / (std + 1e-6))


def test_batch_whiten_shifts_group_sums_off_zero():
    mask = torch.arange(5)[None, :] < torch.tensor([1, 2, 3, 4, 5, 1, 2, 1])[:, None]
    a = adv("grpo", mask=mask, adv_scale="batch_whiten")
    assert abs(float(a[:4].sum())) > 1e-3
    assert not rlcore.get_objective(
        "grpo", adv_scale="batch_whiten", gate="none", aggregation="token_mean"
    ).preserves_cancellation


def test_bonus_is_added_before_centring():
    obj = rlcore.get_objective("dr_grpo", bonus_coef=0.5)
    bonus = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    got = obj.advantages(REWARDS, GIDS, MASK, bonus=bonus)
    shaped = (REWARDS + 0.5 * bonus).view(2, 4)
    torch.testing.assert_close(got, (shaped - shaped.mean(1, keepdim=True)).flatten())


def test_shaping_callable_is_applied_before_centring():
    obj = rlcore.get_objective("dr_grpo")
    got = obj.advantages(REWARDS, GIDS, MASK, shaping=lambda r, g: r * 2)
    torch.testing.assert_close(got, 2 * adv("dr_grpo"))


def test_integer_rewards_are_accepted():
    torch.testing.assert_close(adv(rewards=torch.tensor([1, 0, 0, 1, 3, 1, 2, 2])), adv())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(rewards=torch.tensor([1.0, float("nan"), 0, 1, 3, 1, 2, 2])), "rewards: contains 1 NaN"),
        (dict(rewards=torch.ones(8, 1)), "rewards: expected a 1-D"),
        (dict(rewards=torch.ones(7)), "group_ids: expected shape"),
        (dict(group_ids=GIDS.float()), "group_ids: expected an integer"),
        (dict(group_ids=torch.tensor([4, 4, 4, 4, 9, 9, 9, 1])), "single response"),
        (dict(group_ids=torch.tensor([4, 4, 4, 4, 4, 9, 9, 9])), "same size"),
        (dict(mask=torch.ones(8, 5).index_fill_(0, torch.tensor([2]), 0)), "no active tokens"),
        (dict(mask=torch.ones(7, 5)), "mask: expected 8 rows"),
        (dict(bonus=torch.ones(3)), "bonus: expected shape"),
        (dict(shaping=lambda r, g: r[:3]), "shaping"),
    ],
)
def test_bad_advantage_inputs_name_the_argument(kwargs, match):
    args = dict(rewards=REWARDS, group_ids=GIDS, mask=MASK) | kwargs
    obj = rlcore.get_objective("grpo")
    with pytest.raises(ValueError, match=match):
        obj.advantages(args.pop("rewards"), args.pop("group_ids"), args.pop("mask"), **args)
