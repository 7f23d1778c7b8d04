"""The GPU broadcast path's pieces that need no GPU (the protocol itself runs over gloo in test_rollout_pool)."""

import pytest

from tgc_rl.weight_sync.broadcast import rank_offsets


def test_each_replica_gets_its_own_block_of_broadcast_ranks():
    assert rank_offsets(1, 1) == [1]  # rank 0 is the learner's sender
    assert rank_offsets(3, 2) == [1, 3, 5]  # tensor-parallel replicas take one rank per GPU


def test_rank_offsets_refuse_an_empty_group():
    with pytest.raises(ValueError, match="replicas and ranks_per_replica"):
        rank_offsets(0, 1)
