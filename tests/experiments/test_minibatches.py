"""How a rollout batch is dealt into optimizer steps."""

import torch

from experiments.minibatches import minibatch_rows


def _groups(rows, group_size):
    return {int(r) // group_size for r in rows}


def test_whole_groups_stay_inside_one_optimizer_step():
    parts = minibatch_rows(6, 4, 3, split=False, gen=torch.Generator().manual_seed(0))
    assert len(parts) == 3
    seen = [_groups(p, 4) for p in parts]
    assert all(len(p) == 8 for p in parts)
    assert set().union(*seen) == set(range(6)) and sum(len(s) for s in seen) == 6  # no group in two steps


def test_split_groups_are_dealt_evenly_over_every_optimizer_step():
    parts = minibatch_rows(5, 4, 2, split=True, gen=torch.Generator().manual_seed(0))
    for p in parts:
        counts = torch.bincount(p // 4, minlength=5)
        assert counts.tolist() == [2] * 5
    assert sorted(torch.cat(parts).tolist()) == list(range(20))
