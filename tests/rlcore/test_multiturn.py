"""Multi-turn trajectories: the loss mask has holes where observations sit (docs/objectives.md#multi-turn-credit).
Shared nodes are found on the whole history and measured on model tokens; one trajectory-level advantage
with a step-constant normaliser keeps cancellation across turns, and the verdict names what does not."""

from __future__ import annotations

import pytest
import torch

import rlcore
from rlcore.config import TrajectoryCredit, cancellation_verdict
from rlcore.diagnostics import ascent_weights, cancellation_diagnostics
from rlcore.ibpo import naive_credit_mask
from rlcore.offpolicy import behaviour_mismatch
from rlcore.shared_nodes import SharedPrefixes
from tests.rlcore.batches import multi_turn_batch

TOL = rlcore.RESIDUAL_TOLERANCE


def step(seed: int, objective: str = "cp_grpo", advantages=None):
    """(batch, w, advantages) of one step of `objective` on a multi-turn batch; `advantages(m, obj)`
    replaces the objective's own credit (the alternatives below)."""
    m = multi_turn_batch(seed)
    b = m.batch
    obj = rlcore.get_objective(objective)
    adv = (
        obj.advantages(b.rewards, b.group_ids, b.response_mask) if advantages is None else advantages(m, obj)
    )
    w, _ = ascent_weights(obj, m.logprobs, b.rollout_logprobs, adv, b.response_mask, b.group_ids)
    return m, w, adv


def diagnose(objective: str, seed: int, advantages=None, **kw) -> dict[str, float]:
    """Diagnostics of one step, read on the history against the trajectory-level advantages."""
    m, w, adv = step(seed, objective, advantages)
    b = m.batch
    seq_adv = (
        adv
        if adv.ndim == 1
        else rlcore.get_objective(objective).advantages(b.rewards, b.group_ids, b.response_mask)
    )
    return cancellation_diagnostics(
        w, b.response_ids, b.response_mask, b.group_ids, seq_adv, present=b.history_mask, **kw
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cp_grpo_keeps_d1_and_d2_at_rounding_across_turns_and_grpo_does_not(seed):
    cp, grpo = diagnose("cp_grpo", seed), diagnose("grpo", seed)
    m = multi_turn_batch(seed)
    # the shared nodes run through the first tool output into later turns: deeper than the first call
    assert cp["diag/d2_depth_max"] > m.first_turn_len + 5 and cp["diag/d2_nodes"] > 0
    assert cp["diag/d1_prefix_len_mean"] >= m.first_turn_len + 5  # call + its output, group-common
    assert cp["diag/d1_groups_measured"] == 3
    assert cp["diag/d2_residual"] < 1e-12 and cp["diag/d1_gcpr"] < 1e-12
    assert grpo["diag/d2_residual"] > 0.05 and grpo["diag/d1_gcpr"] > 0.05


def test_nodes_past_an_observation_are_found_on_the_history_not_on_the_loss_mask():
    m = multi_turn_batch(0)
    b = m.batch
    on_history = SharedPrefixes.of(b.response_ids, b.history_mask, b.group_ids)
    on_mask = SharedPrefixes.of(b.response_ids, b.response_mask, b.group_ids)
    assert on_mask.depth == m.first_turn_len  # a loss mask with holes stops at the first observation
    assert on_history.depth > m.first_turn_len + 5


def test_observation_tokens_carry_no_weight_and_no_entropy_share():
    m, w, adv = step(0)
    b = m.batch
    assert bool((w[b.response_mask == 0] == 0).all())
    ent = torch.where(b.response_mask.bool(), 1.0, 50.0).double()  # observations' (unused) entropy is large
    d = cancellation_diagnostics(
        w, b.response_ids, b.response_mask, b.group_ids, adv, entropies=ent, present=b.history_mask
    )
    # common-prefix, shared and fork entropies average model tokens only
    assert d["diag/d7_entropy_common"] == 1.0 and d["diag/d7_entropy_shared"] == 1.0
    assert d["diag/d7_entropy_fork"] == 1.0 and d["diag/d7_entropy_divergent"] == 1.0
    assert d["diag/d7_common_tokens"] == 3 * 4 * m.first_turn_len  # 3 groups x 4 rows x the first call


def test_one_prefix_scan_serves_diagnostics_and_mismatch_and_is_checked():
    m, w, adv = step(1)
    b = m.batch
    prefixes = SharedPrefixes.of(b.response_ids, b.history_mask, b.group_ids)
    args = (w, b.response_ids, b.response_mask, b.group_ids, adv)
    assert cancellation_diagnostics(*args, prefixes=prefixes) == cancellation_diagnostics(
        *args, present=b.history_mask
    )
    mm = (m.logprobs, b.rollout_logprobs, b.response_mask, b.response_ids, b.group_ids)
    assert behaviour_mismatch(*mm, prefixes=prefixes) == behaviour_mismatch(*mm, present=b.history_mask)
    with pytest.raises(ValueError, match="prefixes: computed for other rows"):
        cancellation_diagnostics(
            *args, prefixes=SharedPrefixes.of(b.response_ids[:8], b.history_mask[:8], b.group_ids[:8])
        )


def test_mismatch_compares_engine_logprobs_on_model_tokens_only():
    m = multi_turn_batch(2)
    b = m.batch
    beh = b.rollout_logprobs.clone()
    out = behaviour_mismatch(
        m.logprobs, beh, b.response_mask, b.response_ids, b.group_ids, present=b.history_mask
    )
    # copies of shared model tokens agree (a function of the history); observations are not pairs
    assert out.shared_pairs > 0 and out.spread_max == 0
    model_pairs = 0
    for g in b.group_ids.unique():
        rows = (b.group_ids == g).nonzero().flatten().tolist()
        for i, a in enumerate(rows):
            for c in rows[i + 1 :]:
                same = (
                    (b.response_ids[a] == b.response_ids[c])
                    & b.history_mask[a].bool()
                    & b.history_mask[c].bool()
                )
                k = int(same.long().cumprod(0).sum())
                model_pairs += int((b.response_mask[a, :k].bool() & b.response_mask[c, :k].bool()).sum())
    assert out.shared_pairs == model_pairs


# -- the credit rule ---------------------------------------------------------------------------------


def per_turn_normaliser(m, obj):
    """A mean over each turn's tokens: each model token's advantage divided by its turn's length."""
    adv = obj.advantages(m.batch.rewards, m.batch.group_ids, m.batch.response_mask)
    size = torch.zeros_like(m.logprobs)
    for i in range(m.turns.shape[0]):
        for k in m.turns[i].unique().tolist():
            if k >= 0:
                size[i, m.turns[i] == k] = float((m.turns[i] == k).sum())
    return torch.where(size > 0, adv[:, None] / size.clamp_min(1), 0.0)


def per_turn_rewards(m, obj):
    """The trajectory's advantage split over its model turns, an equal share A_i / K_i each."""
    b = m.batch
    adv = obj.advantages(b.rewards, b.group_ids, b.response_mask)
    turns = (m.turns.max(1).values + 1).to(adv.dtype)
    return (adv / turns)[:, None] * b.response_mask


def filtered_after_centring(m, obj):
    """The deadline-hit trajectory (last of each group) dropped after its group was centred."""
    b = m.batch
    adv = obj.advantages(b.rewards, b.group_ids, b.response_mask).clone()
    adv[3::4] = 0.0
    return adv


def filtered_before_centring(m, obj):
    b = m.batch
    keep = torch.ones(len(b), dtype=torch.bool)
    keep[3::4] = False
    return obj.advantages(b.rewards, b.group_ids, b.response_mask, keep=keep)


@pytest.mark.parametrize(
    "alternative", [per_turn_normaliser, per_turn_rewards, filtered_after_centring], ids=lambda f: f.__name__
)
def test_the_alternatives_the_verdict_names_break_cancellation_in_fact(alternative):
    """Read against the trajectory's advantage A_i, the rule's one advantage: a normaliser or a split is a
    coefficient of it. The per-turn normaliser shows on nodes shared past the first tool output (second
    calls, one extending the other: turns of unequal length); the first turn is equal in every sibling."""
    d = diagnose("cp_grpo", 0, advantages=alternative)
    key = "diag/d2_residual" if alternative is per_turn_normaliser else "diag/d1_gcpr"
    assert d[key] > 0.01


def test_a_filter_before_centring_keeps_it():
    d = diagnose("cp_grpo", 0, advantages=filtered_before_centring)
    assert (
        d["diag/d1_gcpr"] < 1e-12 and d["diag/d2_residual"] < 1e-12 and d["diag/d4_adv_sum_abs_max"] < 1e-12
    )


def test_the_verdict_keeps_the_trajectory_rule_and_names_each_alternative():
    cfg = rlcore.resolve("cp_grpo")
    assert cancellation_verdict(cfg, TrajectoryCredit()) == (True, [])
    cases = {
        TrajectoryCredit(normaliser="trajectory"): "trajectory's model tokens",
        TrajectoryCredit(normaliser="turn"): "turn's tokens",
        TrajectoryCredit(reward="per_turn"): "reward='per_turn'",
        TrajectoryCredit(filter="after_centring"): "keep=",
    }
    for credit, phrase in cases.items():
        ok, reasons = cancellation_verdict(cfg, credit)
        assert not ok and len(reasons) == 1 and phrase in reasons[0]
    ok, reasons = cancellation_verdict(cfg, TrajectoryCredit("turn", "per_turn", "after_centring"))
    assert not ok and len(reasons) == 3
    # the objective's own reasons stay: grpo's 1/l_i is a per-trajectory normaliser too
    assert not cancellation_verdict(rlcore.resolve("grpo"), TrajectoryCredit())[0]


def test_a_bad_credit_value_names_the_field():
    with pytest.raises(ValueError, match=r"TrajectoryCredit.normaliser: 'sequence' is not one of step"):
        TrajectoryCredit(normaliser="sequence")


def test_ibpo_edits_land_on_model_tokens():
    m = multi_turn_batch(0)
    b = m.batch
    n = int(b.response_mask[1].sum())
    edits = [None, [True, False] * (n // 2) + [True] * (n % 2)] + [None] * (len(b) - 2)
    out = naive_credit_mask(edits, b.response_mask)
    assert torch.equal(out[0], b.response_mask[0])
    assert bool((out[1][b.response_mask[1] == 0] == 0).all())
    assert out[1][b.response_mask[1].bool()].tolist() == [float(e) for e in edits[1]]


def test_a_token_the_model_sampled_and_one_an_observation_wrote_are_not_copies():
    # rows 0 and 1 share the history [1, 2]; row 0 sampled token 2, the environment wrote row 1's
    from rlcore.shared_nodes import shared_node_residual

    w = torch.tensor([[1.0, 1.0, 0.5], [-1.0, 0.0, -2.0]], dtype=torch.float64)
    ids = torch.tensor([[1, 2, 3], [1, 2, 4]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    out = shared_node_residual(
        w,
        ids,
        mask,
        torch.tensor([1.0, -1.0], dtype=torch.float64),
        torch.zeros(2, dtype=torch.long),
        present=torch.ones(2, 3),
    )
    assert out["diag/d2_nodes"] == 1 and out["diag/d2_residual"] == 0  # t=0 only: t=1 has one model copy
