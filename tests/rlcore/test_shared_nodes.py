"""D2: the exchangeability residual on every node shared by two or more responses (rlcore.shared_nodes)."""

from __future__ import annotations

import pytest
import torch

import rlcore
from rlcore.diagnostics import ascent_weights, cancellation_diagnostics
from rlcore.shared_nodes import HostGroups, pairwise_prefix, shared_node_residual


def d2(w, ids, adv, gids=None, mask=None):
    w = torch.tensor(w, dtype=torch.float64)
    ids = torch.tensor(ids)
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else torch.tensor(mask)
    gids = torch.zeros(len(ids), dtype=torch.long) if gids is None else torch.tensor(gids)
    return shared_node_residual(w, ids, mask, torch.tensor(adv, dtype=torch.float64), gids)


def tree_batch(seed: int, n_groups: int = 4, group_size: int = 6, width: int = 7, vocab: int = 2):
    """Responses over a tiny vocabulary, so that groups share partial prefixes of every depth; log-probs
    are a function of the node (group, prefix), as a model gives identical contexts identical values."""
    g = torch.Generator().manual_seed(seed)
    batch = n_groups * group_size
    gids = torch.arange(batch) // group_size
    tokens = torch.randint(0, vocab, (batch, width), generator=g)
    mask = torch.arange(width)[None, :] < torch.randint(2, width + 1, (batch,), generator=g)[:, None]
    old = torch.empty(batch, width, dtype=torch.float64)
    new = torch.empty_like(old)
    table: dict[tuple[int, ...], tuple[float, float]] = {}
    for i in range(batch):
        for t in range(width):
            key = (int(gids[i]), *tokens[i, : t + 1].tolist())
            if key not in table:
                o = -float(torch.rand((), generator=g)) * 2 - 0.05
                table[key] = (o, o + 0.3 * float(torch.randn((), generator=g)))
            old[i, t], new[i, t] = table[key]
    rewards = (torch.rand(batch, generator=g) < 0.5).double().view(n_groups, group_size)
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0
    return tokens, mask, old, new, rewards.flatten(), gids


def test_residual_and_credit_of_a_hand_built_tree():
    # nodes: token 1 at t=0 (rows 0,1,2), token 2 at t=1 (rows 0,1); kappa = 1, 2, 3 per row (response-coupled)
    out = d2([[1.0] * 3, [-1.0] * 3, [-1.5] * 3], [[1, 2, 3], [1, 2, 4], [1, 5, 6]], [1.0, -0.5, -0.5])
    # t=0: net -1.5, credit 0 (sum A = 0); t=1: net 0, credit kbar 1.5 * sum A 0.5 = 0.75, residual -0.75
    assert out["diag/d2_residual"] == pytest.approx((1.5 + 0.75) / (3.5 + 2.0))
    assert out["diag/d2_credit_frac"] == pytest.approx(0.75 / 5.5)
    assert out["diag/d2_shared_frac"] == pytest.approx(5.5 / 10.5)  # |w| on shared copies / all |w|
    assert (
        out["diag/d2_nodes"] == 2 and out["diag/d2_node_size_mean"] == 2.5 and out["diag/d2_depth_max"] == 2
    )


def test_equal_coefficients_leave_credit_but_no_residual():
    out = d2([[2.0] * 3, [-1.0] * 3, [-1.0] * 3], [[1, 2, 3], [1, 2, 4], [1, 5, 6]], [1.0, -0.5, -0.5])
    assert out["diag/d2_residual"] == 0
    assert out["diag/d2_credit_frac"] == pytest.approx(1.0 / (4.0 + 3.0))  # t=1: kbar 2 * sum A 0.5


def test_shared_tokens_in_padding_and_across_groups_are_not_nodes():
    out = d2(
        [[1.0, 0.0], [-1.0, 0.0], [1.0, 1.0], [2.0, 2.0]],
        [[5, 9], [6, 9], [5, 9], [7, 9]],
        [1.0, -1.0, 1.0, -1.0],
        gids=[0, 0, 1, 1],
        mask=[[True, False], [True, False], [True, True], [True, True]],
    )
    assert out["diag/d2_nodes"] == 0 and out["diag/d2_residual"] == 0


def test_ragged_groups_and_lone_responses():
    gids = torch.tensor([4, 9, 4, 4, 2])
    members = HostGroups.of(gids).members
    assert members.tolist() == [[4, -1, -1], [0, 2, 3], [1, -1, -1]]
    out = d2(
        [[1.0, 1.0], [5.0, 5.0], [-1.0, -1.0], [0.0, 0.0], [3.0, 3.0]],
        [[1, 2], [1, 2], [1, 2], [1, 3], [1, 2]],
        [1.0, 1.0, -1.0, 0.0, 1.0],
        gids=gids.tolist(),
    )
    # group 4 (rows 0, 2, 3): node (t=0, rows 0,2,3) and (t=1, rows 0,2); rows 1 and 4 are alone in their groups
    assert out["diag/d2_nodes"] == 2 and out["diag/d2_node_size_mean"] == 2.5 and out["diag/d2_residual"] == 0


def test_pairwise_prefix_follows_identical_responses_past_one_chunk():
    width = 300
    ids = torch.zeros(3, width, dtype=torch.long)
    ids[1, 250:] = 1
    ids[2, 0] = 7
    lcp = pairwise_prefix(ids, torch.ones(3, width, dtype=torch.bool), torch.tensor([[0, 1, 2]]))
    assert lcp[0].tolist() == [[0, 250, 0], [250, 0, 0], [0, 0, 0]]


EXCHANGEABLE = [
    n for n in rlcore.list_objectives() if rlcore.get_objective(n).preserves_cancellation and n != "dfpo_orth"
]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", EXCHANGEABLE)
def test_exchangeable_presets_leave_no_residual_on_partial_prefixes(name, seed):
    tokens, mask, old, new, rewards, gids = tree_batch(seed)
    obj = rlcore.get_objective(name)
    adv = obj.advantages(rewards, gids, mask)
    w, _ = ascent_weights(obj, new, old, adv, mask, gids)
    out = shared_node_residual(w, tokens, mask, adv, gids)
    assert out["diag/d2_nodes"] > 10
    assert float(out["diag/d2_residual"]) <= 1e-9
    assert float(out["diag/d2_credit_frac"]) > 0.01  # partial prefixes carry credit


@pytest.mark.parametrize("name", ["grpo", "gspo", "grpo_ar", "dfpo_orth"])
def test_response_coupled_presets_leave_a_residual_on_partial_prefixes(name):
    # dfpo_orth included: its reweighting cancels on group-common nodes only (docs/objectives.md#dfpo-transforms)
    tokens, mask, old, new, rewards, gids = tree_batch(0)
    obj = rlcore.get_objective(name)
    adv = obj.advantages(rewards, gids, mask)
    w, _ = ascent_weights(obj, new, old, adv, mask, gids)
    assert float(shared_node_residual(w, tokens, mask, adv, gids)["diag/d2_residual"]) > 0.05


def test_d2_equals_d1_when_the_only_shared_nodes_are_group_common():
    w = [[1.0, 2.0, 5.0], [-1.0, -1.0, 3.0]]
    ids = [[7, 8, 1], [7, 8, 2]]
    got = d2(w, ids, [1.0, -1.0])
    d1 = cancellation_diagnostics(
        torch.tensor(w, dtype=torch.float64),
        torch.tensor(ids),
        torch.ones(2, 3, dtype=torch.bool),
        torch.tensor([0, 0]),
        torch.tensor([1.0, -1.0]),
    )
    assert got["diag/d2_residual"] == pytest.approx(d1["diag/d1_gcpr"])


def test_kernels_compile_without_a_writable_cache(monkeypatch):
    """A read-only install without a home: numba finds no cache location, and the kernels still compile."""
    from numba.core import caching

    from rlcore.shared_nodes import compiled

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])

    @compiled()
    def twice(x):
        return 2 * x

    assert twice(21) == 42
