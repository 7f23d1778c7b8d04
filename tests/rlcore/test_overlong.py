"""Overlong responses handled before centring (rlcore.advantages): DAPO's soft penalty as reward shaping, or
filtering (recentring each group over its kept responses), both keep D2 at rounding; dropping truncated
responses after the advantages are computed does not."""

from __future__ import annotations

import pytest
import torch

import rlcore
from rlcore.advantages import overlong_penalty, overlong_shaping
from rlcore.diagnostics import ascent_weights
from rlcore.shared_nodes import shared_node_residual
from tests.rlcore.test_shared_nodes import tree_batch

WIDTH = 7  # tree_batch's generation budget: a response of 7 tokens was truncated


def test_penalty_is_zero_then_linear_then_minus_factor():
    got = overlong_penalty(torch.tensor([1, 4, 5, 6, 7, 9]), max_len=7, buffer=4, factor=0.5)
    # free up to 7 - 4 = 3 tokens, then -(L - 3) / 4 * 0.5, capped at -0.5
    want = torch.tensor([0.0, -0.125, -0.25, -0.375, -0.5, -0.5], dtype=torch.float64)
    assert torch.allclose(got, want)
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), max_len=7, buffer=0)


def batch(seed: int):
    tokens, mask, old, new, rewards, gids = tree_batch(seed)
    lengths = mask.sum(1)
    truncated = lengths == WIDTH
    assert truncated.any() and (~truncated).view(4, -1).sum(1).min() >= 2  # each group keeps >= 2
    return tokens, mask, old, new, rewards, gids, lengths, truncated


def d2(obj, b, adv, loss_mask=None) -> dict[str, float]:
    tokens, mask, old, new, _, gids, _, _ = b
    w, _ = ascent_weights(obj, new, old, adv, mask if loss_mask is None else loss_mask, gids)
    return shared_node_residual(w, tokens, mask, adv, gids)  # the unmasked advantages, as the learner reads


@pytest.mark.parametrize("seed", range(3))
def test_shaping_before_centring_keeps_d2_at_rounding(seed):
    b = batch(seed)
    _, mask, _, _, rewards, gids, lengths, truncated = b
    obj = rlcore.get_objective("cp_grpo")
    adv = obj.advantages(rewards, gids, mask, shaping=overlong_shaping(lengths, WIDTH, buffer=3))
    assert not torch.allclose(adv, obj.advantages(rewards, gids, mask))  # the penalty acts
    assert torch.allclose(adv.view(4, -1).sum(1), torch.zeros(4, dtype=adv.dtype), atol=1e-12)
    out = d2(obj, b, adv)
    assert out["diag/d2_nodes"] > 10 and float(out["diag/d2_credit_frac"]) > 0.01
    assert float(out["diag/d2_residual"]) <= 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_filtering_before_centring_recentres_the_group_and_keeps_d2_at_rounding(seed):
    b = batch(seed)
    _, mask, _, _, rewards, gids, _, truncated = b
    obj = rlcore.get_objective("cp_grpo")
    adv = obj.advantages(rewards, gids, mask, keep=~truncated)
    assert (adv[truncated] == 0).all()
    assert torch.allclose(adv.view(4, -1).sum(1), torch.zeros(4, dtype=adv.dtype), atol=1e-12)
    for g in range(4):  # each group's kept responses get the advantages of that group alone
        rows = (gids == g) & ~truncated
        alone = obj.advantages(rewards[rows], gids[rows], mask[rows])
        assert torch.allclose(adv[rows], alone)
    out = d2(obj, b, adv)
    assert out["diag/d2_nodes"] > 10 and float(out["diag/d2_residual"]) <= 1e-9


def test_dropping_after_centring_breaks_d2():
    b = batch(0)
    _, mask, _, _, rewards, gids, _, truncated = b
    obj = rlcore.get_objective("cp_grpo")
    adv = obj.advantages(rewards, gids, mask)
    dropped = mask & ~truncated[:, None]  # truncated responses taken out of the loss after centring
    assert float(d2(obj, b, adv, loss_mask=dropped)["diag/d2_residual"]) > 1e-3


def test_keep_handles_groups_left_with_one_response_and_checks_its_input():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.2])
    gids = torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.ones(6, 3)
    keep = torch.tensor([True, True, False, True, False, False])
    for name in ("cp_grpo", "rloo", "dr_grpo"):
        adv = rlcore.get_objective(name).advantages(rewards, gids, mask, keep=keep)
        assert torch.isfinite(adv).all() and (adv[3:] == 0).all()  # one kept response: no signal
        assert adv[0] == -adv[1] and adv[0] > 0
    with pytest.raises(ValueError, match="keep: expected shape"):
        rlcore.get_objective("cp_grpo").advantages(rewards, gids, mask, keep=keep[:3])
