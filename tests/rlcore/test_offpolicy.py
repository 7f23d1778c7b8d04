"""Behaviour-policy corrections (rlcore.offpolicy): closed-form weights, the cancellation verdict and its
condition, D2 on an off-policy batch, and the mismatch diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

import rlcore
from rlcore.config import BEHAVIOUR_CORRECTIONS, TOKEN_CORRECTIONS, cancellation_condition
from rlcore.diagnostics import ascent_weights
from rlcore.offpolicy import MISMATCH_KEYS, behaviour_mismatch
from rlcore.shared_nodes import shared_node_residual
from tests.rlcore.test_shared_nodes import tree_batch

# one group of two responses, three tokens each; A = +1 / -1 (Dr. GRPO-style: no std scale)
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -0.3, -1.5]], dtype=torch.float64)
# log w = old - behaviour: row 0 (0.9, -0.8, 0.2), row 1 (0.9, 1.0, -0.1)
BEH = OLD - torch.tensor([[0.9, -0.8, 0.2], [0.9, 1.0, -0.1]], dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
MASK = torch.ones(2, 3, dtype=torch.bool)
GIDS = torch.tensor([0, 0])


def weights(correction: str, **knobs) -> torch.Tensor:
    """w = -dL/dlogprobs of cp_grpo's knobs with the correction, on policy w.r.t. pi_old (r = 1, gate open)."""
    obj = rlcore.get_objective("cp_grpo", behaviour_correction=correction, **knobs)
    w, _ = ascent_weights(obj, OLD.clone(), OLD, ADV, MASK, GIDS, behaviour_logprobs=BEH)
    return w


def closed_form(coef: list[list[float]]) -> torch.Tensor:
    return torch.tensor(coef, dtype=torch.float64) * ADV[:, None] / 6  # token_mean over 6 tokens


def test_none_is_the_default_and_ignores_behaviour_logprobs():
    obj = rlcore.get_objective("cp_grpo")
    assert obj.config.behaviour_correction == "none"
    w_none, out = ascent_weights(obj, OLD.clone(), OLD, ADV, MASK, GIDS, behaviour_logprobs=BEH)
    w_plain, _ = ascent_weights(obj, OLD.clone(), OLD, ADV, MASK, GIDS)
    assert torch.equal(w_none, w_plain) and "behaviour/corrected_frac" not in out.metrics
    assert torch.allclose(w_plain, closed_form([[1.0] * 3] * 2))
    for name in rlcore.list_objectives():  # no preset turns a correction on
        assert rlcore.get_objective(name).config.behaviour_correction == "none"


def test_token_tis_is_min_of_w_and_the_cap():
    e = math.exp
    want = [[min(e(0.9), 2), e(-0.8), e(0.2)], [min(e(0.9), 2), min(e(1.0), 2), e(-0.1)]]
    assert torch.allclose(weights("token_tis"), closed_form(want))
    want_cap3 = [[e(0.9), e(-0.8), e(0.2)], [e(0.9), min(e(1.0), 3), e(-0.1)]]
    assert torch.allclose(weights("token_tis", behaviour_cap=3.0), closed_form(want_cap3))


def test_token_mask_keeps_w_inside_the_band_and_zeroes_the_rest():
    e = math.exp
    # band [0.5, 2]: e^0.9 = 2.46 and e^1.0 out, e^-0.8 = 0.45 out
    want = [[0.0, 0.0, e(0.2)], [0.0, 0.0, e(-0.1)]]
    assert torch.allclose(weights("token_mask"), closed_form(want))
    want_wide = [[e(0.9), e(-0.8), e(0.2)], [e(0.9), 0.0, e(-0.1)]]
    assert torch.allclose(
        weights("token_mask", behaviour_low=0.4, behaviour_high=2.5), closed_form(want_wide)
    )


def test_sequence_corrections_put_one_response_coefficient_on_every_token():
    e = math.exp
    prod = [e(0.9 - 0.8 + 0.2), e(0.9 + 1.0 - 0.1)]  # e^0.3 = 1.35, e^1.8 = 6.05
    geo = [e(0.3 / 3), e(1.8 / 3)]  # 1.11, 1.82
    assert torch.allclose(weights("seq_tis"), closed_form([[prod[0]] * 3, [2.0] * 3]))
    assert torch.allclose(weights("seq_geo_tis"), closed_form([[geo[0]] * 3, [geo[1]] * 3]))
    assert torch.allclose(weights("seq_geo_tis", behaviour_cap=1.5), closed_form([[geo[0]] * 3, [1.5] * 3]))
    assert torch.allclose(weights("seq_geo_mask", behaviour_high=1.5), closed_form([[1.0] * 3, [0.0] * 3]))


def test_the_correction_is_a_coefficient_on_the_ratio_to_pi_old():
    # decoupled: grpo's token ratio r = pi/pi_old keeps its gradient r*A, the behaviour weight multiplies it
    lp = OLD + torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.0, 0.05]], dtype=torch.float64)
    obj = rlcore.get_objective("dr_grpo", behaviour_correction="token_tis", aggregation="token_mean")
    w, out = ascent_weights(obj, lp, OLD, ADV, MASK, GIDS, behaviour_logprobs=BEH)
    r = torch.exp(lp - OLD)
    c = torch.exp(OLD - BEH).clamp(max=2.0)
    assert torch.allclose(w, c * r * ADV[:, None] / 6)
    assert out.metrics["behaviour/corrected_frac"] == pytest.approx(3 / 6)  # e^0.9 twice and e^1.0 capped
    assert out.metrics["behaviour/coef_mean"] == pytest.approx(float(c.mean()))


def test_a_correction_needs_the_behaviour_logprobs_and_sane_knobs():
    obj = rlcore.get_objective("cp_grpo", behaviour_correction="token_tis")
    with pytest.raises(ValueError, match="behaviour_logprobs: required"):
        obj.loss(OLD.clone(), OLD, ADV, MASK, GIDS)
    with pytest.raises(ValueError, match="behaviour_logprobs: expected shape"):
        obj.loss(OLD.clone(), OLD, ADV, MASK, GIDS, behaviour_logprobs=BEH[:, :2])
    with pytest.raises(ValueError, match="behaviour_high"):
        rlcore.get_objective("cp_grpo", behaviour_correction="token_mask", behaviour_low=2.0)
    with pytest.raises(ValueError, match="geo_mean"):
        rlcore.get_objective("gmpo", behaviour_correction="token_tis")
    with pytest.raises(ValueError, match="is not one of"):
        rlcore.get_objective("cp_grpo", behaviour_correction="tis")


@pytest.mark.parametrize("correction", BEHAVIOUR_CORRECTIONS)
def test_verdict_keeps_cancellation_for_token_level_corrections_only(correction):
    cfg = rlcore.get_objective("cp_grpo", behaviour_correction=correction).config
    keeps, reasons = rlcore.cancellation_verdict(cfg)
    assert keeps == (correction in ("none", *TOKEN_CORRECTIONS)), reasons
    condition = cancellation_condition(cfg)
    assert (condition is not None) == (correction in TOKEN_CORRECTIONS)
    assert condition is None or "equal behaviour log-probs" in condition
    if condition is not None:  # describe() states it beside the verdict
        assert condition in rlcore.get_objective("cp_grpo", behaviour_correction=correction).describe()
    # a correction never repairs a breaking objective: grpo's gate and 1/|o_i| stay reasons
    assert not rlcore.get_objective("grpo", behaviour_correction=correction).preserves_cancellation


def off_policy_tree(seed: int, equal_copies: bool, dtype=torch.float64):
    """tree_batch with behaviour log-probs that differ from the learner's; a function of the node (equal across
    copies of a shared token, as one engine version with identical numerics gives) or per copy."""
    tokens, mask, old, new, rewards, gids = tree_batch(seed)
    if equal_copies:
        beh = old + 0.8 * torch.sin(37.0 * old)  # old is a function of the node, so beh is too
    else:
        g = torch.Generator().manual_seed(seed)
        beh = old + 0.8 * torch.randn(old.shape, generator=g, dtype=old.dtype)
    return tokens, mask, old.to(dtype), new.to(dtype), beh.to(dtype), rewards.to(dtype), gids


def d2(correction: str, seed: int, equal_copies: bool = True, dtype=torch.float64) -> dict[str, float]:
    tokens, mask, old, new, beh, rewards, gids = off_policy_tree(seed, equal_copies, dtype)
    obj = rlcore.get_objective("cp_grpo", behaviour_correction=correction)
    adv = obj.advantages(rewards, gids, mask)
    w, out = ascent_weights(obj, new, old, adv, mask, gids, behaviour_logprobs=beh)
    return {**shared_node_residual(w, tokens, mask, adv, gids), **out.metrics}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("correction", TOKEN_CORRECTIONS)
def test_cp_grpo_with_a_token_correction_keeps_d2_at_rounding_off_policy(correction, seed):
    out = d2(correction, seed)
    assert out["behaviour/corrected_frac"] > 0.05  # the correction truncates or masks on this batch
    assert out["diag/d2_nodes"] > 10 and float(out["diag/d2_credit_frac"]) > 0.01
    assert float(out["diag/d2_residual"]) <= 1e-9
    assert float(d2(correction, seed, dtype=torch.float32)["diag/d2_residual"]) <= 1e-6


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("correction", ["seq_tis", "seq_geo_tis"])
def test_cp_grpo_with_a_sequence_correction_does_not(correction, seed):
    assert float(d2(correction, seed)["diag/d2_residual"]) > 1e-3


def test_token_tis_loses_cancellation_when_copies_carry_different_behaviour_logprobs():
    # the condition is necessary: unequal engine numbers on copies of one token give them unequal weights
    assert float(d2("token_tis", 0, equal_copies=False)["diag/d2_residual"]) > 1e-3


def test_mismatch_reports_k3_and_the_spread_the_condition_depends_on():
    tokens, mask, old, _, beh, _, gids = off_policy_tree(1, equal_copies=True)
    m = behaviour_mismatch(old, beh, mask, tokens, gids)
    r = (old - beh)[mask]
    assert m.tokens == float(mask.sum())
    assert m.k3 == pytest.approx(float((torch.exp(r) - 1 - r).mean()))
    assert m.abs_diff == pytest.approx(float(r.abs().mean())) and m.abs_diff > 0.1
    assert m.shared_pairs > 10 and m.spread_max == 0 and m.spread_mean == 0
    tokens, mask, old, _, beh, _, gids = off_policy_tree(1, equal_copies=False)
    unequal = behaviour_mismatch(old, beh, mask, tokens, gids)
    assert unequal.spread_max > unequal.spread_mean > 0.1
    assert set(unequal.metrics()) == set(MISMATCH_KEYS)


def test_spread_of_a_hand_built_pair():
    # rows 0 and 1 share tokens 0-1 (two pair entries), row 2 shares nothing
    tokens = torch.tensor([[1, 2, 3], [1, 2, 4], [5, 2, 3]])
    beh = torch.tensor([[-1.0, -2.0, -3.0], [-1.5, -2.25, -9.0], [-4.0, -4.0, -4.0]])
    m = behaviour_mismatch(beh, beh, torch.ones(3, 3), tokens, torch.zeros(3, dtype=torch.long))
    assert (m.shared_pairs, m.spread_max, m.spread_mean) == (2.0, 0.5, pytest.approx(0.375))
    assert m.k3 == 0 and m.abs_diff == 0
