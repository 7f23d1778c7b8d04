"""Cancellation diagnostics D1-D11 (docs/diagnostics.md) on hand-built and random batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rlcore
from rlcore.diagnostics import _token_sums_cpu, _token_sums_torch, ascent_weights, cancellation_diagnostics
from tests.rlcore.batches import make_batch

TWO = torch.tensor([0, 0])


def diag(w, ids, mask=None, gids=TWO, adv=None, **kw):
    w = torch.tensor(w, dtype=torch.float64)
    mask = torch.ones_like(w, dtype=torch.bool) if mask is None else torch.tensor(mask)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64) if adv is None else adv
    return cancellation_diagnostics(w, torch.tensor(ids), mask, gids, adv, **kw)


def test_d1_is_net_over_gross_weight_on_the_common_prefix():
    d = diag([[1.0, 2.0, 5.0], [-1.0, -1.0, 3.0]], [[7, 8, 1], [7, 8, 2]])
    assert d["diag/d1_gcpr"] == pytest.approx((0 + 1) / (2 + 3))
    assert d["diag/d1_prefix_len_mean"] == 2 and d["diag/d1_groups_with_prefix_frac"] == 1


def test_d1_prefix_stops_at_padding_even_when_padding_ids_agree():
    d = diag(
        [[1.0, 2.0, 0.0], [-1.0, 0.0, 0.0]],
        [[7, 0, 0], [7, 0, 0]],
        mask=[[True, True, False], [True, False, False]],
    )
    assert d["diag/d1_prefix_len_mean"] == 1 and d["diag/d1_gcpr"] == 0


def test_d1_common_prefix_longer_than_one_chunk_is_found():
    width = 300
    ids = torch.zeros(2, width, dtype=torch.long)
    ids[1, 250:] = 1
    w = torch.ones(2, width, dtype=torch.float64)
    w[1] = -1
    d = cancellation_diagnostics(
        w, ids, torch.ones(2, width, dtype=torch.bool), TWO, torch.tensor([1.0, -1.0])
    )
    assert d["diag/d1_prefix_len_mean"] == 250 and d["diag/d1_gcpr"] == 0


def test_d1_skips_groups_without_signal_or_prefix():
    d = diag([[0.0, 0.0], [0.0, 0.0]], [[1, 2], [1, 3]], adv=torch.zeros(2, dtype=torch.float64))
    assert d["diag/d1_groups_measured"] == 0 and d["diag/d1_gcpr"] == 0
    d = diag([[1.0, 2.0], [1.0, 3.0]], [[1, 2], [4, 3]])
    assert d["diag/d1_prefix_len_mean"] == 0 and d["diag/d1_groups_measured"] == 0


def test_d3_coefficients_are_constant_for_constant_normalisers_and_length_coupled_for_grpo():
    b = make_batch(4, 3, 4, 8, off_policy=0.0)
    b.mask = torch.arange(8)[None, :] < torch.tensor([2, 8, 4, 6] * 3)[:, None]
    out = {}
    for name in ("dr_grpo", "grpo"):
        obj = rlcore.get_objective(name)
        adv = obj.advantages(b.rewards, b.group_ids, b.mask)
        w, _ = ascent_weights(obj, b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids)
        out[name] = cancellation_diagnostics(w, b.token_ids, b.mask, b.group_ids, adv)
    assert out["dr_grpo"]["diag/d3_kappa_cv"] < 1e-9 and out["dr_grpo"]["diag/d3_corr_kappa_len"] == 0
    assert out["grpo"]["diag/d3_kappa_cv"] > 0.1
    assert out["grpo"]["diag/d3_corr_kappa_len"] < -0.8  # kappa = 1/l_i


def test_d4_flags_a_response_that_never_entered_the_loss():
    mask = [[True, True], [False, False]]
    d = diag([[1.0, 1.0], [0.0, 0.0]], [[1, 2], [1, 2]], mask=mask, group_size=2)
    assert d["diag/d4_adv_sum_abs_max"] == 1.0
    d_ok = diag([[1.0, 1.0], [-1.0, -1.0]], [[1, 2], [1, 2]], group_size=2)
    assert d_ok["diag/d4_adv_sum_abs_max"] == 0 and d_ok["diag/d4_groups_complete_frac"] == 1
    d_partial = diag([[1.0, 1.0], [-1.0, -1.0]], [[1, 2], [1, 2]], group_size=4)
    assert d_partial["diag/d4_groups_complete_frac"] == 0


def test_d7_splits_entropy_by_common_prefix_and_first_divergence():
    ent = torch.tensor([[0.1, 0.2, 0.9, 0.5], [0.1, 0.2, 0.7, 0.5]], dtype=torch.float64)
    d = diag([[1.0] * 4, [-1.0] * 4], [[1, 2, 3, 4], [1, 2, 5, 4]], entropies=ent)
    assert d["diag/d7_entropy_common"] == pytest.approx(0.15)
    assert d["diag/d7_entropy_divergent"] == pytest.approx(0.8)
    assert d["diag/d7_entropy_mean"] == pytest.approx(float(ent.mean()))


def test_d7_shared_nodes_and_forks_need_only_two_responses_that_start_alike():
    # rows 0 and 1 share two tokens, row 2 shares nothing: no group-common prefix, but shared nodes and forks
    ent = torch.tensor(
        [[0.1, 0.2, 0.9, 0.5], [0.3, 0.4, 0.7, 0.5], [0.6, 0.8, 0.2, 0.5], [1.0, 1.0, 1.0, 1.0]],
        dtype=torch.float64,
    )
    ids = [[1, 2, 3, 4], [1, 2, 5, 4], [6, 2, 3, 4], [1, 2, 3, 4]]
    mask = [[True] * 4, [True] * 4, [True] * 4, [True, True, False, False]]
    gids = torch.tensor([0, 0, 0, 1])  # row 3 alone in its group: no node to share, no fork
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=torch.float64)
    d = diag([[1.0] * 4] * 4, ids, mask=mask, gids=gids, adv=adv, entropies=ent)
    assert d["diag/d7_common_tokens"] == 0
    assert d["diag/d7_shared_tokens"] == 4 and d["diag/d7_entropy_shared"] == pytest.approx(0.25)
    assert d["diag/d7_fork_rows"] == 3  # rows 0 and 1 at t = 2, row 2 at its first token
    assert d["diag/d7_entropy_fork"] == pytest.approx((0.9 + 0.7 + 0.6) / 3)


def test_d7_identical_responses_are_shared_everywhere_and_never_fork():
    ent = torch.tensor([[0.1, 0.2], [0.3, 0.4]], dtype=torch.float64)
    d = diag([[1.0] * 2, [-1.0] * 2], [[1, 2], [1, 2]], entropies=ent)
    assert d["diag/d7_shared_tokens"] == 4 and d["diag/d7_entropy_shared"] == pytest.approx(0.25)
    assert d["diag/d7_fork_rows"] == 0 and d["diag/d7_entropy_fork"] == 0


def test_d9_shares_follow_old_probability_buckets():
    old = torch.log(torch.tensor([[0.05, 0.3, 0.7, 0.95], [0.05, 0.3, 0.7, 0.95]], dtype=torch.float64))
    d = diag([[1.0] * 4, [-1.0] * 4], [[1, 2, 3, 4], [5, 6, 7, 8]], old_logprobs=old)
    proxy = torch.tensor([0.95, 0.7, 0.3, 0.05])
    want = proxy / proxy.sum()
    got = [d[f"diag/d9_absw_share_{k}"] for k in ("p00_10", "p10_50", "p50_90", "p90_100")]
    assert got == pytest.approx(want.tolist())


def test_d10_clip_fractions_are_split_by_the_sign_of_the_advantage():
    clipped = torch.tensor([[True, True, False, False], [False, False, False, True]])
    d = diag([[1.0] * 4, [-1.0] * 4], [[1, 2, 3, 4], [1, 2, 5, 6]], clipped=clipped)
    assert (d["diag/d10_clipfrac_pos"], d["diag/d10_clipfrac_neg"]) == (0.5, 0.25)
    assert (d["diag/d10_clipfrac_common_pos"], d["diag/d10_clipfrac_common_neg"]) == (1.0, 0.0)


def test_d11_length_coupling():
    gids = torch.tensor([0, 0, 0, 0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    lengths = torch.tensor([2.0, 3.0, 6.0, 7.0], dtype=torch.float64)
    w = torch.zeros(4, 7, dtype=torch.float64)
    mask = torch.arange(7)[None, :] < lengths[:, None]
    d = cancellation_diagnostics(w, torch.zeros(4, 7, dtype=torch.long), mask, gids, adv)
    assert d["diag/d11_corr_len_adv"] == pytest.approx(-0.97, abs=0.01)
    assert (d["diag/d11_len_pos_mean"], d["diag/d11_len_neg_mean"]) == (2.5, 6.5)


def test_optional_families_appear_only_with_their_inputs():
    b = make_batch(0)
    obj = rlcore.get_objective("grpo")
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    w, out = ascent_weights(obj, b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids)
    base = cancellation_diagnostics(w, b.token_ids, b.mask, b.group_ids, adv)
    full = cancellation_diagnostics(
        w,
        b.token_ids,
        b.mask,
        b.group_ids,
        adv,
        old_logprobs=b.old_logprobs,
        entropies=-b.old_logprobs,
        clipped=out.clipped,
    )
    families = {k.split("_")[0] for k in full}
    assert families == {
        "diag/d1",
        "diag/d2",
        "diag/d3",
        "diag/d4",
        "diag/d7",
        "diag/d9",
        "diag/d10",
        "diag/d11",
    }
    assert not any(k.startswith(("diag/d7", "diag/d9", "diag/d10")) for k in base)
    assert all(isinstance(v, float) and math.isfinite(v) for v in full.values())


def test_float32_strided_inputs_and_ragged_groups_give_the_float64_values():
    """The host stage copies what it reads into one layout; dtype, strides and group layout do not change it."""
    b = make_batch(3, n_groups=4, group_size=5, width=12)
    keep = torch.tensor([i for i in range(20) if i not in (3, 11, 12)])  # ragged groups: 4, 5, 3, 5
    obj = rlcore.get_objective("grpo")
    mask, gids, old, lp, tokens = (
        x[keep] for x in (b.mask, b.group_ids, b.old_logprobs, b.logprobs, b.token_ids)
    )
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)[
        keep
    ]  # rows dropped after the advantages (D4's case)
    w, out = ascent_weights(obj, lp, old, adv, mask, gids)
    kw = dict(old_logprobs=old, entropies=-old, clipped=out.clipped)
    want = cancellation_diagnostics(w, tokens, mask, gids, adv, **kw)
    wide = torch.zeros(len(keep), 24)  # float32, every other column: a strided view
    wide[:, ::2] = w.float()
    got = cancellation_diagnostics(
        wide[:, ::2],
        tokens.t().contiguous().t(),
        mask.float(),
        gids,
        adv.float(),
        old_logprobs=old.float(),
        entropies=-old.float(),
        clipped=out.clipped,
    )
    assert want["diag/d2_nodes"] > 0 and want["diag/d1_groups_measured"] > 0
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_torch_token_pass_of_other_devices_matches_the_compiled_cpu_pass(dtype):
    """Stage 1 runs compiled on CPU tensors and as torch ops elsewhere (GPU); both give the same sums."""
    b = make_batch(4, n_groups=3, group_size=4, width=10, dtype=dtype)
    obj = rlcore.get_objective("dapo")
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    w, out = ascent_weights(obj, b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids)
    old = b.old_logprobs.clone()
    old[0, :3] = torch.tensor(
        [math.log(0.1), math.log(0.5), math.log(0.9)], dtype=dtype
    )  # on the bucket edges
    adv2d = adv[:, None] * b.mask
    for args in [(None, None, None, None), (adv2d, -old, out.clipped, old)]:
        cpu_rows, cpu_d9 = _token_sums_cpu(w, b.mask, *args)
        torch_rows, torch_d9 = _token_sums_torch(w, b.mask, *args)
        np.testing.assert_allclose(cpu_rows, torch_rows, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cpu_d9, torch_d9, rtol=1e-5, atol=1e-6)
    assert cpu_d9.sum() > 0 and cpu_rows[:, 5].sum() >= 0


def test_ascent_weights_are_minus_the_loss_gradient():
    b = make_batch(2)
    obj = rlcore.get_objective("gspo", kl_coef=0.1)
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    lp = b.logprobs.clone().requires_grad_(True)
    out = obj.loss(lp, b.old_logprobs, adv, b.mask, b.group_ids, b.ref_logprobs)
    g_pg, g_all = (
        torch.autograd.grad(out.pg_loss, lp, retain_graph=True)[0],
        torch.autograd.grad(out.loss, lp)[0],
    )
    w_pg, _ = ascent_weights(obj, b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids, b.ref_logprobs)
    w_all, _ = ascent_weights(
        obj, b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids, b.ref_logprobs, of="loss"
    )
    torch.testing.assert_close(w_pg, -g_pg)
    torch.testing.assert_close(w_all, -g_all)
    assert not torch.allclose(w_pg, w_all)


def test_backward_of_logprobs_with_ascent_weights_reproduces_the_parameter_gradient():
    """A learner evaluates the loss once, reads w for the diagnostics, and trains with lp.backward(-w)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 6, dtype=torch.float64)
    hidden = torch.randn(6, 5, 4, dtype=torch.float64)
    tokens = torch.randint(0, 6, (6, 5))
    b = make_batch(1, 2, 3, 5)

    def logprobs():
        return torch.log_softmax(head(hidden), -1).gather(-1, tokens[..., None])[..., 0]

    obj = rlcore.get_objective("cp_grpo", kl_coef=0.05)
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    old = logprobs().detach() - 0.1
    obj.loss(logprobs(), old, adv, b.mask, b.group_ids, b.ref_logprobs).loss.backward()
    want = [p.grad.clone() for p in head.parameters()]
    head.zero_grad()
    lp = logprobs()
    w, _ = ascent_weights(obj, lp, old, adv, b.mask, b.group_ids, b.ref_logprobs, of="loss")
    lp.backward(-w)
    for p, g in zip(head.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_bad_diagnostic_inputs_name_the_argument():
    w = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="token_ids: expected an integer"):
        cancellation_diagnostics(w, torch.zeros(2, 3), torch.ones(2, 3), TWO, torch.zeros(2))
    with pytest.raises(ValueError, match="token_ids: expected shape"):
        cancellation_diagnostics(
            w, torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 3), TWO, torch.zeros(2)
        )
    with pytest.raises(ValueError, match="of: must be"):
        ascent_weights(rlcore.get_objective("grpo"), w, w, torch.zeros(2), torch.ones(2, 3), TWO, of="all")
