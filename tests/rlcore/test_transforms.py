"""Lopti stages, Advantage Reweighting and the DFPO transforms (arXiv 2505.12929, 2604.13088 v1)."""

from __future__ import annotations

import math

import pytest
import torch

import rlcore
from rlcore.groups import GroupIndex
from rlcore.transforms import min_replace, orth
from tests.rlcore.batches import make_batch


def test_non_lopti_objective_has_one_stage_equal_to_the_mask():
    b = make_batch(0)
    (stage,) = rlcore.get_objective("grpo").stages(b.old_logprobs, b.mask)
    assert torch.equal(stage, b.mask)


@pytest.mark.parametrize("eta", [0.5, -0.5, 0.2])
def test_lopti_stages_partition_the_mask_by_old_probability(eta):
    b = make_batch(1, 3, 4, 8)
    first, second = rlcore.get_objective("grpo", lopti_eta=eta).stages(b.old_logprobs, b.mask)
    assert not bool((first & second).any())
    assert torch.equal(first | second, b.mask)
    low = b.old_logprobs < math.log(abs(eta))
    assert torch.equal(first, b.mask & (low if eta > 0 else ~low))


@pytest.mark.parametrize("name", ["grpo_lopti", "cp_grpo_lopti"])
def test_lopti_stage_gradients_sum_to_the_one_stage_gradient(name):
    b = make_batch(2, 3, 4, 8)
    obj = rlcore.get_objective(name, kl_coef=0.01)
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    grads = []
    for stage in [None, *obj.stages(b.old_logprobs, b.mask)]:
        lp = b.logprobs.clone().requires_grad_(True)
        out = obj.loss(lp, b.old_logprobs, adv, b.mask, b.group_ids, b.ref_logprobs, stage_mask=stage)
        grads.append(torch.autograd.grad(out.loss, lp)[0])
        if stage is not None:
            assert bool((grads[-1][~stage] == 0).all())  # only the stage's tokens move
    torch.testing.assert_close(grads[1] + grads[2], grads[0])


def test_stage_mask_outside_the_response_mask_is_refused():
    b = make_batch(0)
    obj = rlcore.get_objective("grpo_lopti")
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    with pytest.raises(ValueError, match="stage_mask"):
        obj.loss(b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids, stage_mask=torch.ones_like(b.mask))


def test_advantage_reweighting_scales_each_token_by_its_old_probability():
    b = make_batch(3, 2, 3, 6, off_policy=0.0)
    base, ar = rlcore.get_objective("cp_grpo"), rlcore.get_objective("cp_grpo", ar_alpha=0.3)
    adv = base.advantages(b.rewards, b.group_ids, b.mask)
    grads = []
    for obj in (base, ar):
        lp = b.logprobs.clone().requires_grad_(True)
        grads.append(torch.autograd.grad(obj.loss(lp, b.old_logprobs, adv, b.mask, b.group_ids).loss, lp)[0])
    torch.testing.assert_close(grads[1], grads[0] * (0.3 * b.old_logprobs.exp() + 0.7))


def test_min_replace_gives_every_member_the_group_minimum():
    groups = GroupIndex.of(torch.tensor([5, 5, 9, 9, 9]))
    v = torch.tensor([2.0, 1.0, 3.0, 0.5, 4.0])
    assert min_replace(v, groups).tolist() == [1.0, 1.0, 0.5, 0.5, 0.5]


def test_orth_makes_weights_orthogonal_to_the_group_advantages():
    groups = GroupIndex.of(torch.tensor([0, 0, 0, 1, 1, 1]))
    v = torch.tensor([1.0, 3.0, 2.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -2.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    out = orth(v, adv, groups)
    assert float((out[:3] * adv[:3]).sum()) == pytest.approx(0.0, abs=1e-12)
    assert out[3:].tolist() == [1.0, 1.0, 1.0]  # all-zero advantages: nothing to project out
