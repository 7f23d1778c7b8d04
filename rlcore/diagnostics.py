"""Per-step cancellation diagnostics from the ascent weights w = -dL/dlogprobs (objectives.md sec. 8).

    w, out = ascent_weights(objective, logprobs, old_logprobs, adv, mask, group_ids)   # one autograd call
    metrics = cancellation_diagnostics(w, token_ids, mask, group_ids, adv, old_logprobs=old_logprobs,
                                       entropies=entropies, clipped=out.clipped)

Keys (stable; a family is present iff its inputs were given): D1 `diag/d1_*` group-common-prefix
residual, D2 `diag/d2_*` exchangeability residual on every node shared by >= 2 responses (partial
prefixes too; rlcore.shared_nodes), D3 `diag/d3_*` coefficient dispersion, D4 `diag/d4_*` group integrity, D7 `diag/d7_*` entropy
by position class (needs entropies), D9 `diag/d9_*` |w| by old-probability bucket (needs old_logprobs),
D10 `diag/d10_*` clip fractions by sign of A (needs clipped), D11 `diag/d11_*` length coupling.
Undefined statistics (e.g. no group with a common prefix) are reported as 0 next to a count.
All vectorised over (B, T); the only Python loop runs over column chunks while a common prefix lasts.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from rlcore.groups import GroupIndex
from rlcore.shared_nodes import group_common_prefix, group_members, pairwise_prefix, shared_node_residual
from rlcore.validation import as_mask, bool_to_float, check_group_ids, check_tensor

PROB_BUCKETS = (0.1, 0.5, 0.9)  # D9 buckets of pi_old: [0,.1) [.1,.5) [.5,.9) [.9,1]
_BUCKET_KEYS = ("p00_10", "p10_50", "p50_90", "p90_100")
_CV_NOISE = 1e-5  # float32 rounding level of a coefficient that is constant within a group


def ascent_weights(objective: Any, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   group_ids: Tensor, ref_logprobs: Tensor | None = None, *, of: str = "pg",
                   **loss_kwargs: Any) -> tuple[Tensor, Any]:
    """(w, out): w = -d(out.pg_loss)/d logprobs (of="pg") or -d(out.loss)/d logprobs (of="loss").

    The loss is evaluated on a detached leaf copy of logprobs, so the model's graph is untouched. A
    learner can train from it without a second loss evaluation: with of="loss",
    `logprobs.backward(-w)` gives the same parameter gradients as `out.loss.backward()` (except for an
    entropy bonus, whose gradient flows through `entropies`, not through logprobs).
    KL/entropy terms are node-local regularisers that are not meant to cancel (sec. 5.11), hence of="pg".
    """
    if of not in ("pg", "loss"):
        raise ValueError(f"of: must be 'pg' or 'loss', got {of!r}")
    if not isinstance(logprobs, Tensor):
        raise ValueError(f"logprobs: expected a torch.Tensor, got {type(logprobs).__name__}")
    if loss_kwargs.get("entropies") is not None:  # keep the caller's entropy graph intact
        loss_kwargs["entropies"] = loss_kwargs["entropies"].detach()
    leaf = logprobs.detach().requires_grad_(True)
    out = objective.loss(leaf, old_logprobs, advantages, mask, group_ids, ref_logprobs, **loss_kwargs)
    target = out.pg_loss if of == "pg" else out.loss
    (grad,) = torch.autograd.grad(target, leaf)
    return -grad, out


def cancellation_diagnostics(w: Tensor, token_ids: Tensor, mask: Tensor, group_ids: Tensor, advantages: Tensor, *,
                             old_logprobs: Tensor | None = None, entropies: Tensor | None = None,
                             lengths: Tensor | None = None, clipped: Tensor | None = None,
                             group_size: int | None = None) -> dict[str, float]:
    """D1, D2, D3, D4, D7, D9, D10, D11 of one optimizer step as floats (objectives.md sec. 8).

    w (B, T) ascent weights (zero off the mask, as `ascent_weights` gives them); token_ids (B, T)
    response token ids aligned with mask; advantages (B,) or (B, T); lengths (B,) response lengths for
    D11 (default: mask row sums); group_size: expected G for D4 (default: the largest group seen).
    """
    check_tensor("w", w, ndim=2)
    shape = tuple(w.shape)
    if 0 in shape:
        raise ValueError(f"w: empty batch of shape {shape}")
    check_tensor("token_ids", token_ids, shape, kind="int")
    groups = GroupIndex.of(check_group_ids(group_ids, shape[0]))
    check_tensor("advantages", advantages, ndim=(1, 2))
    w = w.detach()
    w = w if w.dtype == torch.float64 else w.float()
    mf = as_mask("mask", mask, shape, w.dtype, check_values=False)  # the loss has validated it
    wm = w * mf
    tokens = mf.sum(1)  # active tokens per response
    lengths = tokens if lengths is None else check_tensor("lengths", lengths, (shape[0],), kind="mask").to(w.dtype)
    adv = advantages.detach().to(w.dtype)
    seq_adv = adv if adv.ndim == 1 else (adv * mf).sum(1) / tokens.clamp_min(1)

    members = group_members(groups)
    lcp = pairwise_prefix(token_ids, mf, members)  # one scan of the token ids serves D1 and D2
    prefix = group_common_prefix(lcp, members)  # (n,) common prefix length per group
    inv = groups.inverse
    row_prefix = prefix[inv]
    width = int(prefix.max()) if prefix.numel() else 0
    in_prefix = torch.arange(width, device=w.device)[None, :] < row_prefix[:, None]  # (B, width)

    out: dict[str, Tensor] = {}
    out.update(_d1(wm[:, :width] * in_prefix, prefix, seq_adv, groups))
    absw = wm.abs()  # (B, T) |w|, shared by D2 and D9 (each full-batch pass costs ~0.1-0.5 ms on CPU)
    out.update(shared_node_residual(wm, token_ids, mf, adv, groups, members, lcp, gross_all=absw.sum()))
    out.update(_row_families(wm, tokens, lengths, seq_adv, groups, group_size))
    if entropies is not None:
        check_tensor("entropies", entropies, shape)
        out.update(_d7(entropies.detach().to(w.dtype), mf, in_prefix, row_prefix, tokens, groups))
    if old_logprobs is not None:
        check_tensor("old_logprobs", old_logprobs, shape)
        out.update(_d9(absw, old_logprobs.detach().to(w.dtype)))
    if clipped is not None:
        check_tensor("clipped", clipped, shape, kind="mask")
        out.update(_d10(clipped, mf, in_prefix, seq_adv))
    values = torch.stack([v.to(torch.float64) for v in out.values()]).tolist()
    return dict(zip(out, values, strict=True))


def _d1(wp: Tensor, prefix: Tensor, seq_adv: Tensor, groups: GroupIndex) -> dict[str, Tensor]:
    """D1 GCPR: rho_g = sum_t |sum_i w| / sum_t sum_i |w| over the group-common prefix (sec. 8)."""
    width = wp.shape[1]
    sums = groups.sum(torch.cat([wp, wp.abs(), (seq_adv != 0).to(wp.dtype)[:, None]], 1))  # one reduction
    net, gross, signal = sums[:, :width].abs().sum(1), sums[:, width:2 * width].sum(1), sums[:, -1]
    valid = (prefix > 0) & (gross > 0) & (signal > 0)  # skip groups with all A = 0
    rho = torch.where(valid, net / gross.clamp_min(1e-30), torch.zeros_like(net))
    multi = groups.counts >= 2
    return {
        "diag/d1_gcpr": rho.sum() / valid.sum().clamp_min(1),
        "diag/d1_gcpr_max": rho.max(),
        "diag/d1_groups_measured": valid.sum(),
        "diag/d1_prefix_len_mean": (prefix * multi).sum() / multi.sum().clamp_min(1),
        "diag/d1_groups_with_prefix_frac": ((prefix > 0) & multi).sum() / groups.n,
    }


def _row_families(wm: Tensor, tokens: Tensor, lengths: Tensor, seq_adv: Tensor, groups: GroupIndex,
                  group_size: int | None) -> dict[str, Tensor]:
    """D3 (coefficient dispersion), D4 (group integrity), D11 (length coupling) from per-response values,
    in float64 and with two stacked per-group reductions (the batch dimension is small)."""
    f64 = torch.float64
    mean_w = (wm.sum(1) / tokens.clamp_min(1)).to(f64)  # kappa_i * A_i, averaged over the response
    adv, length = seq_adv.to(f64), lengths.to(f64)
    entered = (tokens > 0).to(f64)
    valid = (seq_adv != 0).to(f64) * entered
    kappa = mean_w / torch.where(valid > 0, adv, torch.ones_like(adv)) * valid
    g = groups.sum(torch.stack([valid, kappa, kappa * kappa, entered, adv * entered, mean_w, mean_w.abs()], 1))
    cnt, s1, s2, members, adv_sum, net, gross = g.unbind(1)
    mean = s1 / cnt.clamp_min(1)
    std = (s2 / cnt.clamp_min(1) - mean * mean).clamp_min(0).sqrt()
    ok = (cnt >= 2) & (mean != 0)
    cv = torch.where(ok, std / mean.abs().clamp_min(1e-300), torch.zeros_like(std))
    # rounding noise (cv ~ 1e-7) would otherwise yield arbitrary correlations below
    kappa = torch.where((cv < _CV_NOISE)[groups.inverse], mean[groups.inverse], kappa) * valid
    corr = _pooled_corrs([(kappa, adv, valid), (kappa, length, valid), (length, adv, entered)], groups)
    has = gross > 0
    want = group_size if group_size is not None else int(groups.counts.max())
    pos, neg = (adv > 0).to(f64) * entered, (adv < 0).to(f64) * entered
    return {
        "diag/d3_kappa_cv": cv.sum() / ok.sum().clamp_min(1),
        "diag/d3_corr_kappa_adv": corr[0],
        "diag/d3_corr_kappa_len": corr[1],
        "diag/d3_group_net_weight": torch.where(has, net.abs() / gross.clamp_min(1e-300), torch.zeros_like(net)).sum()
        / has.sum().clamp_min(1),
        "diag/d4_adv_sum_abs_max": adv_sum.abs().max(),
        "diag/d4_adv_sum_abs_mean": adv_sum.abs().mean(),
        "diag/d4_groups_complete_frac": (members == want).to(f64).mean(),
        "diag/d11_corr_len_adv": corr[2],
        "diag/d11_len_pos_mean": (length * pos).sum() / pos.sum().clamp_min(1),
        "diag/d11_len_neg_mean": (length * neg).sum() / neg.sum().clamp_min(1),
    }


def _pooled_corrs(pairs: list[tuple[Tensor, Tensor, Tensor]], groups: GroupIndex) -> Tensor:
    """Within-group correlations: each pair (x, y, weight) is centred by its group means over weighted rows,
    then pooled; 0 where a side has no within-group variance. One reduction for all pairs."""
    cols = []
    for x, y, v in pairs:
        cols += [v, x * v, y * v, x * y * v, x * x * v, y * y * v]
    g = groups.sum(torch.stack(cols, 1)).view(groups.n, len(pairs), 6)
    n, sx, sy, sxy, sxx, syy = g.unbind(2)
    n = n.clamp_min(1)
    cov, vx, vy = (sxy - sx * sy / n).sum(0), (sxx - sx * sx / n).sum(0), (syy - sy * sy / n).sum(0)
    # variances at float64 rounding level of the raw second moments count as zero
    vx = torch.where(vx > 1e-12 * sxx.sum(0), vx, torch.zeros_like(vx))
    vy = torch.where(vy > 1e-12 * syy.sum(0), vy, torch.zeros_like(vy))
    den = (vx * vy).sqrt()
    return torch.where(den > 0, cov / den.clamp_min(1e-300), torch.zeros_like(den)).clamp(-1, 1)


def _d7(ent: Tensor, mf: Tensor, in_prefix: Tensor, row_prefix: Tensor, tokens: Tensor,
        groups: GroupIndex) -> dict[str, Any]:
    """D7: mean entropy overall, on group-common-prefix positions, and at the first divergent position."""
    width = in_prefix.shape[1]
    common = (ent[:, :width] * in_prefix).sum() / in_prefix.sum().clamp_min(1)
    diverges = (row_prefix < tokens) & (groups.counts[groups.inverse] >= 2)
    at = row_prefix.clamp(max=ent.shape[1] - 1)[:, None]
    first_div = torch.gather(ent, 1, at)[:, 0]
    return {
        "diag/d7_entropy_mean": torch.dot(ent.flatten(), mf.flatten()) / tokens.sum().clamp_min(1),
        "diag/d7_entropy_common": common,
        "diag/d7_entropy_divergent": (first_div * diverges).sum() / diverges.sum().clamp_min(1),
    }


def _d9(absw: Tensor, old: Tensor) -> dict[str, Tensor]:
    """D9: share of sum |w| (1 - p) by pi_old bucket (a logit-space gradient-norm proxy, sec. 8).

    Bucket sums are dot products with 0/1 indicators S(log p >= log e); the comparison writes a float
    tensor directly (vectorised on CPU, unlike a bool result or a bucketize/bincount scatter).
    absw (|w| on the mask) is overwritten: it is the indicators' buffer, since each fresh (B*T) buffer
    costs page faults on CPU."""
    flat = old.flatten()
    indicator = absw.flatten()
    proxy = torch.exp(flat).neg_().add_(1.0).mul_(indicator)
    at_least = [proxy.sum()]
    for edge in PROB_BUCKETS:
        torch.ge(flat, math.log(edge), out=indicator)
        at_least.append(torch.dot(proxy, indicator))
    at_least.append(torch.zeros_like(at_least[0]))
    denom = at_least[0].clamp_min(1e-30)
    return {f"diag/d9_absw_share_{k}": (at_least[i] - at_least[i + 1]) / denom for i, k in enumerate(_BUCKET_KEYS)}


def _d10(clipped: Tensor, mf: Tensor, in_prefix: Tensor, seq_adv: Tensor) -> dict[str, Any]:
    """D10: gate/clip fractions for A>0 vs A<0 responses, overall and on group-common prefixes."""
    cf = bool_to_float(clipped.contiguous(), mf.dtype) if clipped.dtype == torch.bool else clipped.to(mf.dtype)
    n_rows = mf.sum(1)
    rows = (cf.mul_(mf) if cf is not clipped else cf * mf).sum(1)
    width = in_prefix.shape[1]
    crow, n_crow = (cf[:, :width] * in_prefix).sum(1), in_prefix.sum(1)
    pos, neg = seq_adv > 0, seq_adv < 0

    def frac(num: Tensor, den: Tensor, sel: Tensor) -> Tensor:
        return (num * sel).sum() / (den * sel).sum().clamp_min(1)

    return {
        "diag/d10_clipfrac_pos": frac(rows, n_rows, pos),
        "diag/d10_clipfrac_neg": frac(rows, n_rows, neg),
        "diag/d10_clipfrac_common_pos": frac(crow, n_crow, pos),
        "diag/d10_clipfrac_common_neg": frac(crow, n_crow, neg),
    }
