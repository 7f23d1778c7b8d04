"""tgc_rl.batch: a step's samples are collated without advantages; attaching them checks the batch once."""

import pytest
import torch

from tgc_rl.batch import Completion, SampledBatch, TrainBatch, collate, validate_batch


def _sampled() -> SampledBatch:
    prompts = [[5, 6, 7]] * 2 + [[8, 9]] * 2
    responses = [[10, 11, 12], [10, 13], [14], [15, 16]]
    comps = [Completion(r, [-1.0] * len(r), "stop", 0) for r in responses]
    return collate(prompts, comps, [0, 0, 1, 1], torch.tensor([1.0, 0.0, 0.0, 1.0]), pad_id=2)


def test_collate_makes_a_batch_without_advantages():
    batch = _sampled()
    assert not isinstance(batch, TrainBatch) and not hasattr(batch, "advantages")
    assert batch.prompt_len == 3 and batch.response_mask.sum(1).tolist() == [3.0, 2.0, 1.0, 2.0]


def test_attached_advantages_train_as_given_and_a_credit_mask_scales_them_per_token():
    sampled = _sampled()
    adv = torch.tensor([0.5, -0.5, -0.5, 0.5])
    plain = sampled.with_advantages(adv)
    assert plain.loss_advantages is adv and plain.credit is None
    credit = sampled.response_mask.clone()
    credit[1, 0] = 0.0  # a token the mask takes out of row 1's credit
    masked = sampled.with_advantages(adv, credit)
    assert torch.equal(masked.advantages, adv)  # what the diagnostics read: unmasked
    assert torch.equal(masked.loss_advantages, adv[:, None] * credit)
    assert masked.loss_advantages[1, 0] == 0.0 and masked.loss_advantages[1, 1] == -0.5


def test_a_batch_is_checked_when_its_advantages_are_attached():
    sampled = _sampled()
    with pytest.raises(ValueError, match="advantages contains NaN"):
        sampled.with_advantages(torch.tensor([0.5, float("nan"), 0.0, 0.0]))
    with pytest.raises(ValueError, match=r"credit must be \(B, T\)"):
        sampled.with_advantages(torch.zeros(4), torch.ones(4, 2))
    with pytest.raises(ValueError, match="a credit mask scales"):
        sampled.with_advantages(torch.zeros(sampled.response_mask.shape), sampled.response_mask)


def test_select_picks_every_per_row_tensor():
    sampled = _sampled()
    batch = sampled.with_advantages(torch.tensor([0.5, -0.5, -0.5, 0.5]), sampled.response_mask)
    sub = batch.select([3, 0])
    assert isinstance(sub, TrainBatch) and sub.advantages.tolist() == [0.5, 0.5]
    assert torch.equal(sub.credit, sampled.response_mask[[3, 0]]) and sub.rewards.tolist() == [1.0, 1.0]


def test_split_group_is_refused(make_batch):
    batch = make_batch(n_groups=2, group_size=2)
    batch.group_ids = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="group_ids: group 0 is not contiguous"):
        validate_batch(batch)


def test_misshapen_batch_names_the_field(make_batch):
    batch = make_batch(n_groups=2)
    batch.rollout_logprobs = batch.rollout_logprobs[:, :-1]
    with pytest.raises(ValueError, match="rollout_logprobs"):
        validate_batch(batch)
    batch = make_batch(n_groups=2)
    batch.advantages[0] = float("nan")
    with pytest.raises(ValueError, match="advantages contains NaN"):
        validate_batch(batch)
