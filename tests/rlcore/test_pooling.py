"""Pooling diagnostics over the parts of one step: micro-batches of whole groups give the whole batch's values."""

import pytest
import torch

import rlcore
from rlcore.diagnostics import ascent_weights, cancellation_diagnostics
from rlcore.pooling import defined_diagnostics, pool_diagnostics, pooling_terms


def _batch(n_groups: int = 4, g: int = 4, width: int = 10, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 3, (n_groups * g, width), generator=gen)
    ids[:, :2] = 7  # every group shares its first two tokens
    ids[:g, 0] = torch.arange(g)  # ... except group 0, which has no common prefix
    lengths = torch.randint(4, width + 1, (n_groups * g,), generator=gen)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    rewards = torch.randint(0, 2, (n_groups * g,), generator=gen).float()
    rewards[::g], rewards[1::g] = 0.0, 1.0  # a signal in every group
    gids = torch.arange(n_groups * g) // g
    lp = -torch.rand(n_groups * g, width, generator=gen, dtype=torch.float64)
    old = lp + 0.3 * torch.randn(lp.shape, generator=gen, dtype=torch.float64)
    return ids, mask, rewards, gids, lp, old


def test_micro_batches_of_whole_groups_pool_to_the_whole_batch():
    ids, mask, rewards, gids, lp, old = _batch()
    obj = rlcore.get_objective("grpo")
    adv = obj.advantages(rewards, gids, mask)
    w, out = ascent_weights(obj, lp, old, adv, mask, gids)

    def diag(rows):
        return cancellation_diagnostics(
            w[rows],
            ids[rows],
            mask[rows],
            gids[rows],
            adv[rows],
            old_logprobs=old[rows],
            entropies=-lp[rows],
            clipped=out.clipped[rows],
            group_size=4,
        )

    whole = diag(slice(None))
    parts = [(diag(slice(a, a + 8)), 2.0) for a in (0, 8)]
    pooled = pool_diagnostics(parts)
    for key in (
        "diag/d1_gcpr",
        "diag/d1_groups_measured",
        "diag/d1_gcpr_max",
        "diag/d2_nodes",
        "diag/d2_depth_max",
        "diag/d4_groups_complete_frac",
        "diag/d7_entropy_common",
        "diag/d7_common_tokens",
        "diag/d7_entropy_shared",
        "diag/d7_shared_tokens",
        "diag/d7_entropy_fork",
        "diag/d7_fork_rows",
        "diag/d1_groups_with_prefix_frac",
    ):
        assert pooled[key] == pytest.approx(whole[key], rel=1e-9), key
    # the part without a measured group pulls neither D1's mean nor its maximum towards 0
    assert parts[0][0]["diag/d1_groups_measured"] == 1 and parts[1][0]["diag/d1_groups_measured"] == 2


def test_a_part_that_does_not_define_a_statistic_is_left_out():
    measured = {
        "diag/d1_gcpr": 0.3,
        "diag/d1_gcpr_max": 0.5,
        "diag/d1_groups_measured": 2.0,
        "diag/d1_groups_with_prefix_frac": 1.0,
        "diag/d10_clipfrac_common_pos": 0.25,
        "diag/d3_kappa_cv": 0.2,
    }
    empty = {
        "diag/d1_gcpr": 0.0,
        "diag/d1_gcpr_max": 0.0,
        "diag/d1_groups_measured": 0.0,
        "diag/d1_groups_with_prefix_frac": 0.0,
        "diag/d10_clipfrac_common_pos": 0.0,
        "diag/d3_kappa_cv": 0.4,
    }
    pooled = pool_diagnostics([(measured, 2.0), (empty, 2.0)])
    assert pooled["diag/d1_gcpr"] == 0.3 and pooled["diag/d1_gcpr_max"] == 0.5
    assert pooled["diag/d10_clipfrac_common_pos"] == 0.25
    assert pooled["diag/d3_kappa_cv"] == pytest.approx(0.3)  # averaged over both parts' groups
    assert pooled["diag/d1_groups_measured"] == 2.0
    assert pool_diagnostics([empty]).keys() == defined_diagnostics(empty).keys()
    assert "diag/d1_gcpr" not in defined_diagnostics(empty)
    assert {t.key: t.rule for t in pooling_terms(measured)}["diag/d1_groups_measured"] == "sum"
