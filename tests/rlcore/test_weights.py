"""The gradient of every preset's loss equals the closed-form ascent weight of docs/objectives.md#presets.

The reference formulas below are written independently of rlcore's implementation: per preset, the
weight w[i,t] = -dL/dlogprob[i,t] as the documentation states it (kappa x A x gate).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlcore
from tests.rlcore.batches import make_batch

DRAWS = dict(
    seed=st.integers(0, 10_000),
    n_groups=st.integers(1, 3),
    group_size=st.integers(2, 5),
    width=st.integers(1, 7),
    off_policy=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    binary=st.booleans(),
)
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _groups(gid: torch.Tensor) -> list[torch.Tensor]:
    return [(gid == g).nonzero().flatten() for g in torch.unique(gid)]


def ppo_gate(r, a, lo, hi):
    """PPO activity: A>0 tokens live while r <= 1+eps_h, A<0 while r >= 1-eps_l ('gate+-')."""
    return torch.where(a > 0, r <= 1 + hi, r >= 1 - lo).to(r.dtype)


def closed_form(name, cfg, lp, old, ref, adv, mask, gid) -> torch.Tensor:
    m = mask.to(lp.dtype)
    n_seq, n_tok, big_l = lp.shape[0], m.sum(), lp.shape[1]
    lengths = m.sum(1, keepdim=True)
    a = adv[:, None]
    r = torch.exp(lp - old)
    p_old = torch.exp(old)
    s = torch.exp(((lp - old) * m).sum(1, keepdim=True) / lengths)  # GSPO sequence ratio
    lo, hi = cfg.clip_low, cfg.clip_high
    if name in ("grpo", "grpo_lopti"):  # A r gate / (G l_i)
        w = a * r * ppo_gate(r, a, lo, hi) / (n_seq * lengths)
    elif name == "grpo_ar":  # AR factor (alpha p_old + 1 - alpha)
        w = a * (0.3 * p_old + 0.7) * r * ppo_gate(r, a, lo, hi) / (n_seq * lengths)
    elif name == "dr_grpo":  # A r gate / (G L)
        w = a * r * ppo_gate(r, a, lo, hi) / (n_seq * big_l)
    elif name in ("dapo", "reinforce_pp_baseline"):  # A r gate / N_tok
        w = a * r * ppo_gate(r, a, lo, hi) / n_tok
    elif name == "gspo":  # s_i A_i gate_seq(s_i) / (G l_i)
        w = s * a * ppo_gate(s, a, lo, hi) / (n_seq * lengths)
    elif name == "gmpo":  # s^_i A_i 1[unclipped] / (G l_i)
        logr = lp - old
        clipped_logr = torch.where(a > 0, logr.clamp(max=hi), logr.clamp(min=-lo))
        s_hat = torch.exp((clipped_logr * m).sum(1, keepdim=True) / lengths)
        live = torch.where(a > 0, logr <= hi, logr >= -lo).to(lp.dtype)
        w = s_hat * a * live / (n_seq * lengths)
    elif name == "cispo":  # sg(min(r, 5)) A / N_tok
        w = r.clamp(max=5.0) * a / n_tok
    elif name == "rloo":  # A / Z with the node-local IS weight r
        w = r * a / n_seq
    elif name in ("cp_grpo", "cp_grpo_lopti", "cp_grpo_ar", "ibpo_cp"):  # m(nu) sg(q(nu)) A / Z
        inside = ((r >= 0.8) & (r <= 1.28)).to(lp.dtype)
        w = inside * r.clamp(0.8, 1.28) * a / n_tok
        if name == "cp_grpo_ar":
            w = w * (0.3 * p_old + 0.7)
    elif name == "dfpo_min":  # sg(min_j s_j) A_i / (G L)
        s_min = s.clone()
        for rows in _groups(gid):
            s_min[rows] = s[rows].min()
        w = s_min * a / (n_seq * big_l)
    elif name == "dfpo_orth":  # u = s_i/(G l_i), u <- u - (A.u/|A|^2) A per group
        u = (s / (n_seq * lengths))[:, 0]
        for rows in _groups(gid):
            ag, ug = adv[rows], u[rows]
            if float((ag * ag).sum()) > 0:
                u[rows] = ug - (ag * ug).sum() / (ag * ag).sum() * ag
        w = u[:, None] * a
    else:
        raise AssertionError(f"no closed form for {name}")
    if cfg.kl_coef > 0:  # node-local KL weight with the preset's own normaliser
        c = {
            "seq_mean_token_mean": 1 / (n_seq * lengths),
            "token_mean": 1 / n_tok,
            "seq_mean_token_sum": 1.0 / n_seq,
            "constant": 1.0 / (n_seq * big_l),
        }[cfg.aggregation]
        d = lp - ref
        dkl = {"k1": torch.ones_like(d), "k2": d, "k3": 1 - torch.exp(-d)}[cfg.kl_estimator]
        w = w - cfg.kl_coef * c * dkl
    return w * m


def _weights(obj, b, adv):
    lp = b.logprobs.clone().requires_grad_(True)
    out = obj.loss(lp, b.old_logprobs, adv, b.mask, b.group_ids, b.ref_logprobs)
    (grad,) = torch.autograd.grad(out.loss, lp)
    return -grad


@pytest.mark.parametrize("name", rlcore.list_objectives())
@SETTINGS
@given(**DRAWS)
def test_gradient_equals_closed_form_weight(name, seed, n_groups, group_size, width, off_policy, binary):
    b = make_batch(seed, n_groups, group_size, width, off_policy=off_policy, binary=binary)
    obj = rlcore.get_objective(name)
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    want = closed_form(name, obj.config, b.logprobs, b.old_logprobs, b.ref_logprobs, adv, b.mask, b.group_ids)
    torch.testing.assert_close(_weights(obj, b, adv), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "cp_grpo", "rloo"])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_kl_term_adds_its_closed_form_weight(name, estimator, seed):
    b = make_batch(seed, 2, 3, 5)
    obj = rlcore.get_objective(name, kl_coef=0.05, kl_estimator=estimator)
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    want = closed_form(name, obj.config, b.logprobs, b.old_logprobs, b.ref_logprobs, adv, b.mask, b.group_ids)
    torch.testing.assert_close(_weights(obj, b, adv), want, rtol=1e-9, atol=1e-12)


def test_dual_clip_removes_gradient_of_negative_tokens_beyond_c():
    obj = rlcore.get_objective("grpo", gate="dual", dual_clip_c=2.0)
    old = torch.zeros(2, 3, dtype=torch.float64)
    lp = torch.log(torch.tensor([[0.5, 1.1, 2.5], [0.5, 1.1, 2.5]], dtype=torch.float64))
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    leaf = lp.clone().requires_grad_(True)
    out = obj.loss(leaf, old, adv, mask, torch.tensor([0, 0]))
    w = -torch.autograd.grad(out.loss, leaf)[0] * (2 * 3)  # undo 1/(G l_i)
    r = lp.exp()
    # A>0: live below 1.2 (r=0.5, 1.1); A<0: live above 0.8 and at most c=2 (only r=1.1)
    want = torch.tensor([[r[0, 0], r[0, 1], 0.0], [0.0, -r[1, 1], 0.0]], dtype=torch.float64)
    torch.testing.assert_close(w, want)
    assert out.clipped.tolist() == [[False, False, True], [True, False, True]]


def test_entropy_bonus_gradient_is_minus_coef_times_normaliser():
    b = make_batch(1, 2, 3, 5)
    obj = rlcore.get_objective("dapo", entropy_coef=0.01)
    ent = torch.rand(b.mask.shape, dtype=torch.float64, requires_grad=True)
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    out = obj.loss(b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids, entropies=ent)
    (grad,) = torch.autograd.grad(out.loss, ent)
    torch.testing.assert_close(grad, -0.01 * b.mask.to(grad.dtype) / b.mask.sum())
