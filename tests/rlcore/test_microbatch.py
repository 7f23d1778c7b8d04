"""Splitting one optimizer step into micro-batches (or ranks) leaves the loss and its gradient unchanged
when every call gets the step's totals (StepNorm); DFPO presets need whole groups or precomputed weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlcore
from rlcore import StepNorm
from tests.rlcore.batches import make_batch

NAMES = rlcore.list_objectives()


def full_and_split(obj, b, parts: list[torch.Tensor], *, precompute: bool = False, crop: bool = True):
    """Gradient of the full-batch loss, and of the sum over micro-batches (rows `parts`), each cropped
    to its own longest response (dynamic padding)."""
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    lp = b.logprobs.clone().requires_grad_(True)
    full = obj.loss(lp, b.old_logprobs, adv, b.mask, b.group_ids, b.ref_logprobs).loss
    (g_full,) = torch.autograd.grad(full, lp)

    step = StepNorm.from_mask(b.mask, group_size=b.group_size)
    weights = (
        obj.sequence_weights(b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids, step=step)
        if precompute
        else None
    )
    lp = b.logprobs.clone().requires_grad_(True)
    total = 0.0
    for rows in parts:
        width = int(b.mask[rows].sum(1).max()) if crop else b.mask.shape[1]
        cut = (slice(None), slice(0, width))
        out = obj.loss(
            lp[rows][cut],
            b.old_logprobs[rows][cut],
            adv[rows],
            b.mask[rows][cut],
            b.group_ids[rows],
            b.ref_logprobs[rows][cut],
            step=step,
            seq_weights=None if weights is None else weights[rows],
        )
        total = total + out.loss
    (g_split,) = torch.autograd.grad(total, lp)
    return full, total, g_full, g_split


def group_parts(b, n_parts: int, seed: int) -> list[torch.Tensor]:
    """Whole groups, shuffled over micro-batches of unequal sizes."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.unique(b.group_ids)
    order = ids[torch.randperm(ids.numel(), generator=g)]
    chunks = [c for c in torch.tensor_split(order, n_parts) if c.numel()]
    return [torch.isin(b.group_ids, c).nonzero().flatten() for c in chunks]


def row_parts(b, n_parts: int, seed: int) -> list[torch.Tensor]:
    """Arbitrary rows: groups split across micro-batches."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(b.group_ids.numel(), generator=g)
    return [c for c in torch.tensor_split(order, n_parts) if c.numel()]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n_parts=st.integers(2, 4), off_policy=st.sampled_from([0.0, 0.3]))
def test_micro_batches_with_whole_groups_give_the_full_gradient(name, seed, n_parts, off_policy):
    b = make_batch(seed, 4, 3, 9, off_policy=off_policy)
    obj = rlcore.get_objective(name, kl_coef=0.02)
    full, total, g_full, g_split = full_and_split(obj, b, group_parts(b, n_parts, seed))
    torch.testing.assert_close(total, full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_split, g_full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in NAMES if not rlcore.get_objective(n).needs_whole_groups])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_micro_batches_may_split_groups_for_objectives_without_group_transform(name, seed):
    b = make_batch(seed, 3, 4, 9)
    obj = rlcore.get_objective(name)
    _, _, g_full, g_split = full_and_split(obj, b, row_parts(b, 3, seed))
    torch.testing.assert_close(g_split, g_full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["dfpo_min", "dfpo_orth"])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_dfpo_split_mid_group_matches_with_precomputed_sequence_weights(name, seed):
    b = make_batch(seed, 3, 4, 9)
    obj = rlcore.get_objective(name, kl_coef=0.02)
    _, _, g_full, g_split = full_and_split(obj, b, row_parts(b, 3, seed), precompute=True)
    torch.testing.assert_close(g_split, g_full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["dfpo_min", "dfpo_orth"])
def test_dfpo_refuses_partial_groups_without_sequence_weights(name):
    b = make_batch(0, 3, 4, 9)
    obj = rlcore.get_objective(name)
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    rows = torch.tensor([0, 1, 4, 5, 6, 7])  # half of group 0, all of group 1
    with pytest.raises(ValueError, match="whole groups"):
        obj.loss(
            b.logprobs[rows],
            b.old_logprobs[rows],
            adv[rows],
            b.mask[rows],
            b.group_ids[rows],
            step=StepNorm.from_mask(b.mask, group_size=4),
        )


def test_per_micro_batch_normalisers_would_break_the_sum():
    """Why StepNorm exists: without it, token_mean divides by each micro-batch's own token count."""
    b = make_batch(5, 4, 3, 9)
    obj = rlcore.get_objective("dapo")
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    full = obj.loss(b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids).loss
    parts = group_parts(b, 2, 0)
    split = sum(
        obj.loss(b.logprobs[r], b.old_logprobs[r], adv[r], b.mask[r], b.group_ids[r]).loss for r in parts
    )
    assert not torch.isclose(split, full)


def test_step_norm_smaller_than_the_call_is_refused():
    b = make_batch(0, 2, 3, 6)
    obj = rlcore.get_objective("cp_grpo")
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    with pytest.raises(ValueError, match="whole optimizer step"):
        obj.loss(
            b.logprobs,
            b.old_logprobs,
            adv,
            b.mask,
            b.group_ids,
            step=StepNorm(tokens=2, sequences=6, length=6),
        )


def test_step_norm_combine_sums_parts():
    parts = [
        StepNorm(tokens=10, sequences=2, length=5, group_size=2),
        StepNorm(tokens=7, sequences=2, length=8, group_size=2),
    ]
    assert StepNorm.combine(parts) == StepNorm(tokens=17, sequences=4, length=8, group_size=2)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(tokens=0, sequences=1, length=1),
        dict(tokens=1, sequences=0, length=1),
        dict(tokens=1, sequences=1, length=0),
        dict(tokens=1, sequences=1, length=1, group_size=0),
    ],
)
def test_step_norm_rejects_non_positive_totals(kwargs):
    with pytest.raises(ValueError, match="StepNorm"):
        StepNorm(**kwargs)
