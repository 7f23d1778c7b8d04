"""The step plan: whole groups per optimizer step, rank and micro-batch; aligned collectives."""

import pytest
import torch

from tgc_rl.learner.plan import MicroBatchLimit, group_spans, plan_minibatches, trim_padding


def _groups_of(rows: torch.Tensor, batch) -> set[int]:
    return set(batch.group_ids[rows].tolist())


@pytest.mark.parametrize("mini_batches,world_size,micro", [(1, 1, 4), (2, 2, 4), (1, 3, 8), (3, 2, 5)])
def test_every_split_keeps_groups_whole_and_rows_once(make_batch, mini_batches, world_size, micro):
    batch = make_batch(n_groups=6, group_size=4)
    groups = group_spans(batch)
    plans = plan_minibatches(groups, mini_batches, world_size, MicroBatchLimit(micro))
    assert len(plans) == mini_batches
    seen = []
    for mb in plans:
        step_rows = set(mb.rows.tolist())
        for rank_micro in mb.micro:
            for rows in rank_micro:
                assert set(rows.tolist()) <= step_rows
                for g in _groups_of(rows, batch):  # a group's rows are all in this micro-batch
                    assert set((batch.group_ids == g).nonzero().flatten().tolist()) <= set(rows.tolist())
                seen.extend(rows.tolist())
    assert sorted(seen) == list(range(len(batch)))  # every row exactly once over the optimizer steps


def test_ranks_run_the_same_number_of_passes(make_batch):
    batch = make_batch(n_groups=5, group_size=4)
    mb = plan_minibatches(group_spans(batch), 1, 2, MicroBatchLimit(4))[0]
    passes = [mb.for_rank(r) for r in range(2)]
    assert len(passes[0]) == len(passes[1]) == 3  # 5 groups of 4 over 2 ranks with 4 rows per micro-batch
    assert sum(p is None for p in passes[0] + passes[1]) == 1  # one padding pass on the lighter rank


def test_micro_batch_smaller_than_a_group_keeps_the_group_whole(make_batch):
    batch = make_batch(n_groups=2, group_size=4)
    mb = plan_minibatches(group_spans(batch), 1, 1, MicroBatchLimit(3))[0]
    assert [len(r) for r in mb.for_rank(0)] == [4, 4]


def test_groups_know_their_cost_in_either_forward(make_batch):
    batch = make_batch(n_groups=3, group_size=4)
    prompt = batch.attention_mask[:, : batch.prompt_len].sum(1)
    response = batch.response_mask.sum(1)
    for g in group_spans(batch):
        rows = list(g.rows)
        assert g.tokens == int((prompt[rows] + response[rows]).sum())
        assert g.longest == int((prompt[rows] + response[rows]).max())
        assert g.tree_tokens == int(prompt[g.start] + response[rows].sum())  # the prompt once


@pytest.mark.parametrize("tree", [True, False])
def test_a_token_budget_packs_whole_groups_up_to_it(make_batch, tree):
    batch = make_batch(n_groups=8, group_size=4)
    groups = group_spans(batch)
    cost = max(g.tree_tokens for g in groups) if tree else 4 * max(g.longest for g in groups)
    limit = MicroBatchLimit(rows=64, tokens=3 * cost, tree=tree)
    micro = plan_minibatches(groups, 1, 1, limit)[0].for_rank(0)
    assert [len(r) for r in micro] == [12, 12, 8]  # 3 groups fit the budget even at the widest group's size
    for rows in micro:
        mine = [g for g in groups if g.start in set(rows.tolist())]
        assert limit.fits(mine)
    assert (
        len(
            plan_minibatches(groups, 1, 1, MicroBatchLimit(rows=8, tokens=3 * cost, tree=tree))[0].for_rank(0)
        )
        == 4
    )


def test_a_group_over_the_token_budget_runs_alone(make_batch):
    batch = make_batch(n_groups=3, group_size=4)
    micro = plan_minibatches(group_spans(batch), 1, 1, MicroBatchLimit(64, tokens=16, tree=True))[0].for_rank(
        0
    )
    assert [len(r) for r in micro] == [4, 4, 4]


def test_more_mini_batches_than_groups_is_refused(make_batch):
    batch = make_batch(n_groups=2)
    with pytest.raises(ValueError, match="mini_batches"):
        plan_minibatches(group_spans(batch), 3, 1, MicroBatchLimit(8))


def test_trim_padding_drops_only_padding(make_batch):
    batch = make_batch(n_groups=3, max_prompt=12)
    rows = torch.tensor([0, 1, 2, 3])
    sub = batch.select(rows)
    trimmed = trim_padding(sub)
    assert trimmed.input_ids.shape[1] < sub.input_ids.shape[1]
    assert trimmed.attention_mask.sum() == sub.attention_mask.sum()
    assert torch.equal(
        trimmed.response_ids * trimmed.response_mask.long(),
        (sub.response_ids * sub.response_mask.long())[:, : trimmed.response_ids.shape[1]],
    )


def test_trim_padding_trims_a_credit_mask_with_the_responses(make_batch):
    batch = make_batch(n_groups=2, max_response=12)
    credit = batch.response_mask.clone()
    credit[:, 0] = 0.0
    batch = batch.with_advantages(batch.advantages, credit)
    trimmed = trim_padding(batch.select([0, 1]))
    T = trimmed.response_mask.shape[1]
    assert trimmed.credit is not None and trimmed.credit.shape == (2, T)
    assert torch.equal(trimmed.credit, credit[:2, :T])
