"""Per-step cancellation diagnostics from the ascent weights w = -dL/dlogprobs (docs/diagnostics.md).

    w, out = ascent_weights(objective, logprobs, old_logprobs, adv, mask, group_ids)   # one autograd call
    metrics = cancellation_diagnostics(w, token_ids, mask, group_ids, adv, old_logprobs=old_logprobs,
                                       entropies=entropies, clipped=out.clipped)

Keys (stable; a family is present iff its inputs were given): D1 `diag/d1_*` group-common-prefix
residual, D2 `diag/d2_*` exchangeability residual on every node shared by >= 2 responses (partial
prefixes too; rlcore.shared_nodes), D3 `diag/d3_*` coefficient dispersion, D4 `diag/d4_*` group integrity, D7 `diag/d7_*` entropy
by position class (needs entropies), D9 `diag/d9_*` |w| by old-probability bucket (needs old_logprobs),
D10 `diag/d10_*` clip fractions by sign of A (needs clipped), D11 `diag/d11_*` length coupling.
Undefined statistics (e.g. no group with a common prefix) are reported as 0 next to a count.

Two stages. Stage 1 is one pass over the whole (B, T) batch that leaves per-response sums (B,) and D9's
bucket sums: a numba-compiled loop over zero-copy views on CPU, torch ops on other devices. Stage 2 is
everything per group and per shared node, on the host in float64, in numba-compiled loops over those sums
and over the first columns only (as deep as some pair of responses agrees): ~B x G values, where torch's
per-call dispatch would cost more than the arithmetic.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlcore.shared_nodes import (
    F64,
    HostGroups,
    SharedPrefixes,
    compiled,
    group_common_prefix,
    node_residual,
    to_host,
)
from rlcore.validation import as_mask, check_group_ids, check_tensor

PROB_BUCKETS = (0.1, 0.5, 0.9)  # D9 buckets of pi_old: [0,.1) [.1,.5) [.5,.9) [.9,1]
_BUCKET_KEYS = ("p00_10", "p10_50", "p50_90", "p90_100")
_CV_NOISE = 1e-5  # float32 rounding level of a coefficient that is constant within a group


def ascent_weights(
    objective: Any,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    ref_logprobs: Tensor | None = None,
    *,
    of: str = "pg",
    **loss_kwargs: Any,
) -> tuple[Tensor, Any]:
    """(w, out): w = -d(out.pg_loss)/d logprobs (of="pg") or -d(out.loss)/d logprobs (of="loss").

    The loss is evaluated on a detached leaf copy of logprobs, so the model's graph is untouched. A
    learner can train from it without a second loss evaluation: with of="loss",
    `logprobs.backward(-w)` gives the same parameter gradients as `out.loss.backward()` (except for an
    entropy bonus, whose gradient flows through `entropies`, not through logprobs).
    KL/entropy terms are node-local regularisers that are not meant to cancel (docs/objectives.md#kl-and-entropy-terms),
    hence of="pg".
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


def cancellation_diagnostics(
    w: Tensor,
    token_ids: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    advantages: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
    lengths: Tensor | None = None,
    clipped: Tensor | None = None,
    group_size: int | None = None,
    present: Tensor | None = None,
    prefixes: SharedPrefixes | None = None,
) -> dict[str, float]:
    """D1, D2, D3, D4, D7, D9, D10, D11 of one optimizer step as floats (docs/diagnostics.md).

    w (B, T) ascent weights (zero off the mask, as `ascent_weights` gives them); token_ids (B, T)
    response token ids aligned with mask; advantages (B,) or (B, T); lengths (B,) response lengths for
    D11 (default: mask row sums); group_size: expected G for D4 (default: the largest group seen).
    Multi-turn responses: `mask` is the loss mask (model tokens) and `present` (B, T) every token of the
    history (model and observation tokens; default `mask`): shared nodes are found on the history and
    measured on model tokens. `prefixes`: that comparison already made for these rows
    (`SharedPrefixes.of(token_ids, present, group_ids)`), so a caller that also needs it scans once.
    """
    check_tensor("w", w, ndim=2)
    shape = tuple(w.shape)
    if 0 in shape:
        raise ValueError(f"w: empty batch of shape {shape}")
    check_tensor("token_ids", token_ids, shape, kind="int")
    check_group_ids(group_ids, shape[0])
    check_tensor("advantages", advantages, ndim=(1, 2))
    if lengths is not None:
        check_tensor("lengths", lengths, (shape[0],), kind="mask")
    for name, x in (("entropies", entropies), ("old_logprobs", old_logprobs)):
        if x is not None:
            check_tensor(name, x, shape)
    if clipped is not None:
        check_tensor("clipped", clipped, shape, kind="mask")
    if present is not None:
        check_tensor("present", present, shape, kind="mask")

    # stage 1: one pass over (B, T) -> per-response sums and D9's bucket sums
    w = w.detach()
    w = w if w.dtype == torch.float64 else w.float()
    inputs = [
        x if x is None else x.detach()
        for x in (advantages if advantages.ndim == 2 else None, entropies, clipped, old_logprobs)
    ]
    per_row, d9 = (_token_sums_cpu if w.device.type == "cpu" else _token_sums_torch)(w, mask, *inputs)
    rows = dict(zip(_ROW_SUMS, per_row.T, strict=True))
    tokens = rows["tokens"]
    rows["seq_adv"] = (
        to_host(advantages, F64) if advantages.ndim == 1 else rows["adv"] / np.maximum(tokens, 1)
    )
    rows["lengths"] = tokens if lengths is None else to_host(lengths, F64)
    gross = rows["abs_w"].sum()

    # stage 2, host: per group and per shared node, on the first `depth` columns
    if prefixes is None:  # one scan of the token ids serves D1 and D2
        prefixes = SharedPrefixes.of(token_ids, mask if present is None else present, group_ids)
    else:
        prefixes.check(group_ids)
    groups, lcp = prefixes.groups, prefixes.lcp
    prefix = group_common_prefix(lcp, groups.members)  # (n,) common prefix length per group
    depth = prefixes.depth
    width = int(prefix.max()) if prefix.size else 0  # <= depth
    row_prefix = prefix[groups.inverse]
    # group-common positions that are model tokens (observations in a shared history carry no weight)
    in_prefix = (np.arange(width)[None, :] < row_prefix[:, None]) & (to_host(mask[:, :width], F64) != 0)
    m_head = to_host(mask[:, :depth], F64)
    w_head = to_host(w[:, :depth], F64) * m_head
    adv_head = rows["seq_adv"] if advantages.ndim == 1 else to_host(advantages[:, :depth], F64)

    out = _d1(w_head, prefix, rows["seq_adv"], groups)
    out.update(node_residual(w_head, m_head, adv_head, groups.members, lcp, gross))
    out.update(_row_families(rows, groups, group_size))
    if entropies is not None:
        out["diag/d7_entropy_mean"] = rows["entropy"].sum() / max(tokens.sum(), 1)
        cols = min(depth + 1, shape[1])
        ent_head = to_host(entropies[:, :cols], F64)
        model_head = to_host(mask[:, :cols], F64) != 0
        out.update(_d7(ent_head, model_head, in_prefix, row_prefix, groups))
        shared_depth = _shared_depth(lcp, groups.members, shape[0])
        out.update(_d7_shared(ent_head, model_head, shared_depth, groups))
    if old_logprobs is not None:
        total = max(d9.sum(), 1e-30)
        out.update({f"diag/d9_absw_share_{k}": v / total for k, v in zip(_BUCKET_KEYS, d9, strict=True)})
    if clipped is not None:
        out.update(_d10(rows, to_host(clipped[:, :width], F64) * in_prefix, in_prefix))
    return {k: float(v) for k, v in out.items()}


_ROW_SUMS = ("sum_w", "abs_w", "tokens", "adv", "entropy", "clipped")  # columns of the stage-1 row sums
_LOG_EDGES = np.log(np.array(PROB_BUCKETS))


def _token_sums_cpu(
    w: Tensor,
    mask: Tensor,
    adv: Tensor | None,
    ent: Tensor | None,
    clipped: Tensor | None,
    old: Tensor | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1 on CPU tensors: one compiled pass over zero-copy views (bool masks are read as bytes)."""

    def view(x: Tensor) -> np.ndarray:
        x = x.contiguous()
        return (x.view(torch.uint8) if x.dtype == torch.bool else x).numpy()

    def maybe(x: Tensor | None) -> np.ndarray | None:
        return None if x is None else view(x)

    old_np = maybe(None if old is None else old.to(w.dtype))
    # p - 1 = expm1(log p): numpy's SIMD loop (2x torch's exp here; numba's exp is scalar), exact near p = 1
    p_minus_1 = None if old_np is None else np.expm1(old_np)
    w_np = view(w)
    edges = _LOG_EDGES.astype(w_np.dtype)  # compared in the log-probs' own precision
    return _token_sums(
        w_np, view(mask), maybe(adv), maybe(ent), maybe(clipped), p_minus_1, old_np, edges, w_np.dtype.type(0)
    )


@compiled(fastmath={"reassoc", "contract"})
def _token_sums(
    w: np.ndarray,
    mask: np.ndarray,
    adv: np.ndarray | None,
    ent: np.ndarray | None,
    clipped: np.ndarray | None,
    p_minus_1: np.ndarray | None,
    old: np.ndarray | None,
    log_edges: np.ndarray,
    zero: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """(B, len(_ROW_SUMS)) sums over each response's masked tokens, and D9's sum |w| (1 - p) per bucket of
    log pi_old (the three edges log_edges; p_minus_1 = pi_old - 1); a column whose input is None stays 0.
    A response's sums run in w's precision (`zero`), as torch's reductions do, then add up in float64;
    fastmath lets them vectorise (reassociated additions only: NaN and inf still propagate)."""
    rows = np.zeros((w.shape[0], 6))
    d9 = np.zeros(4)
    e0, e1, e2 = log_edges[0], log_edges[1], log_edges[2]
    for i in range(w.shape[0]):
        sum_w = abs_w = tokens = a_sum = e_sum = c_sum = zero  # register accumulators, one store per row
        s0 = s1 = s2 = s3 = zero  # D9: sum |w| (1 - p) over log p >= each edge (selects: it vectorises)
        for t in range(w.shape[1]):
            m = zero + mask[i, t]
            x = w[i, t] * m
            sum_w += x
            abs_w += abs(x)
            tokens += m
            if adv is not None:
                a_sum += adv[i, t] * m
            if ent is not None:
                e_sum += ent[i, t] * m
            if clipped is not None:
                c_sum += clipped[i, t] * m
            if p_minus_1 is not None and old is not None:  # given together
                v = -abs(x) * p_minus_1[i, t]
                o = old[i, t]
                s0 += v
                s1 += v if o >= e0 else zero
                s2 += v if o >= e1 else zero
                s3 += v if o >= e2 else zero
        d9[0] += s0 - s1
        d9[1] += s1 - s2
        d9[2] += s2 - s3
        d9[3] += s3
        rows[i, 0], rows[i, 1], rows[i, 2] = sum_w, abs_w, tokens
        rows[i, 3], rows[i, 4], rows[i, 5] = a_sum, e_sum, c_sum
    return rows, d9


def _token_sums_torch(
    w: Tensor,
    mask: Tensor,
    adv: Tensor | None,
    ent: Tensor | None,
    clipped: Tensor | None,
    old: Tensor | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1 on other devices (GPU): the same sums as `_token_sums` in torch ops, moved to the host once."""
    mf = as_mask("mask", mask, tuple(w.shape), w.dtype, check_values=False)
    wm = w * mf
    absw = wm.abs()
    zero = torch.zeros_like(w[:, 0])
    cols = [wm.sum(1), absw.sum(1), mf.sum(1)]
    cols += [zero if x is None else (x.to(w.dtype) * mf).sum(1) for x in (adv, ent, clipped)]
    d9 = torch.zeros(len(PROB_BUCKETS) + 1, dtype=w.dtype, device=w.device)
    if old is not None:
        flat = old.to(w.dtype).flatten()
        proxy = torch.exp(flat).neg_().add_(1.0).mul_(absw.flatten())
        d9.index_add_(
            0,
            torch.bucketize(flat, torch.as_tensor(_LOG_EDGES, dtype=w.dtype, device=w.device), right=True),
            proxy,
        )
    both = torch.cat([torch.stack(cols, 1).flatten(), d9]).to(torch.float64)
    host = to_host(both)
    return host[: -d9.numel()].reshape(w.shape[0], len(cols)), host[-d9.numel() :]


def _d1(w_head: np.ndarray, prefix: np.ndarray, seq_adv: np.ndarray, groups: HostGroups) -> dict[str, float]:
    """D1 GCPR: rho_g = sum_t |sum_i w| / sum_t sum_i |w| over the group-common prefix (docs/diagnostics.md#d1-group-common-prefix-residual)."""
    rho, valid = _gcpr(w_head, prefix, seq_adv, groups.members)
    multi = groups.counts >= 2
    return {
        "diag/d1_gcpr": rho.sum() / max(valid.sum(), 1),
        "diag/d1_gcpr_max": rho.max(),
        "diag/d1_groups_measured": valid.sum(),
        "diag/d1_prefix_len_mean": (prefix * multi).sum() / max(multi.sum(), 1),
        "diag/d1_groups_with_prefix_frac": ((prefix > 0) & multi).sum() / groups.n,
    }


@compiled()
def _gcpr(
    w: np.ndarray, prefix: np.ndarray, seq_adv: np.ndarray, members: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(rho, valid) per group; valid: a common prefix, weight on it and a response with A != 0."""
    rho = np.zeros(members.shape[0])
    valid = np.zeros(members.shape[0], dtype=np.bool_)
    for g in range(members.shape[0]):
        signal = False
        for r in members[g]:
            signal |= r >= 0 and seq_adv[r] != 0
        net = gross = 0.0
        for t in range(prefix[g]):
            s = 0.0
            for r in members[g]:
                if r >= 0:
                    s += w[r, t]
                    gross += abs(w[r, t])
            net += abs(s)
        if signal and gross > 0:
            rho[g], valid[g] = net / gross, True
    return rho, valid


_ROW_KEYS = (
    "diag/d3_kappa_cv",
    "diag/d3_corr_kappa_adv",
    "diag/d3_corr_kappa_len",
    "diag/d3_group_net_weight",
    "diag/d4_adv_sum_abs_max",
    "diag/d4_adv_sum_abs_mean",
    "diag/d4_groups_complete_frac",
    "diag/d11_corr_len_adv",
    "diag/d11_len_pos_mean",
    "diag/d11_len_neg_mean",
)


def _row_families(
    rows: dict[str, np.ndarray], groups: HostGroups, group_size: int | None
) -> dict[str, float]:
    """D3 (coefficient dispersion), D4 (group integrity), D11 (length coupling) from per-response values."""
    want = group_size if group_size is not None else int(groups.counts.max())
    values = _row_stats(
        rows["sum_w"],
        rows["tokens"],
        rows["seq_adv"],
        rows["lengths"],
        groups.inverse,
        groups.n,
        want,
        _CV_NOISE,
    )
    return dict(zip(_ROW_KEYS, values, strict=True))


@compiled()
def _row_stats(
    sum_w: np.ndarray,
    tokens: np.ndarray,
    adv: np.ndarray,
    length: np.ndarray,
    inverse: np.ndarray,
    n: int,
    want: int,
    cv_noise: float,
) -> tuple[float, ...]:
    """The values of `_ROW_KEYS`. kappa_i = mean_t w / A_i; its within-group coefficient of variation (D3),
    pooled within-group correlations (centred by group means, 0 without variance on a side), sums of A over
    the responses that entered the loss (D4), mean length by sign of A (D11)."""
    rows = sum_w.size
    mean_w = sum_w / np.maximum(tokens, 1)  # kappa_i * A_i, averaged over the response
    entered = tokens > 0
    valid = (adv != 0) & entered
    kappa = np.where(valid, mean_w / np.where(valid, adv, 1.0), 0.0)
    cnt, s1, s2, members = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    adv_sum, net, gross = np.zeros(n), np.zeros(n), np.zeros(n)
    for i in range(rows):
        g = inverse[i]
        cnt[g] += valid[i]
        s1[g] += kappa[i]
        s2[g] += kappa[i] * kappa[i]
        members[g] += entered[i]
        adv_sum[g] += adv[i] * entered[i]
        net[g] += mean_w[i]
        gross[g] += abs(mean_w[i])
    mean = s1 / np.maximum(cnt, 1)
    std = np.sqrt(np.maximum(s2 / np.maximum(cnt, 1) - mean * mean, 0))
    ok = (cnt >= 2) & (mean != 0)
    cv = np.where(ok, std / np.maximum(np.abs(mean), 1e-300), 0.0)
    # rounding noise (cv ~ 1e-7) would otherwise yield arbitrary correlations
    for i in range(rows):
        kappa[i] = (mean[inverse[i]] if cv[inverse[i]] < cv_noise else kappa[i]) * valid[i]
    # pairs (x, y, weight): (kappa, A, valid), (kappa, length, valid), (length, A, entered)
    m = np.zeros((n, 3, 6))  # per group and pair: sum v, vx, vy, vxy, vxx, vyy
    for i in range(rows):
        g = inverse[i]
        for p, (x, y, v) in enumerate(
            (
                (kappa[i], adv[i], valid[i] * 1.0),
                (kappa[i], length[i], valid[i] * 1.0),
                (length[i], adv[i], entered[i] * 1.0),
            )
        ):
            m[g, p, 0] += v
            m[g, p, 1] += x * v
            m[g, p, 2] += y * v
            m[g, p, 3] += x * y * v
            m[g, p, 4] += x * x * v
            m[g, p, 5] += y * y * v
    corr = np.zeros(3)
    for p in range(3):
        cov = vx = vy = sxx = syy = 0.0
        for g in range(n):
            k = max(m[g, p, 0], 1.0)
            cov += m[g, p, 3] - m[g, p, 1] * m[g, p, 2] / k
            vx += m[g, p, 4] - m[g, p, 1] ** 2 / k
            vy += m[g, p, 5] - m[g, p, 2] ** 2 / k
            sxx += m[g, p, 4]
            syy += m[g, p, 5]
        # variances at float64 rounding level of the raw second moments count as zero
        if vx > 1e-12 * sxx and vy > 1e-12 * syy:
            corr[p] = min(max(cov / np.sqrt(vx * vy), -1.0), 1.0)
    has = gross > 0
    pos, neg = (adv > 0) & entered, (adv < 0) & entered
    return (
        cv.sum() / max(ok.sum(), 1),
        corr[0],
        corr[1],
        np.where(has, np.abs(net) / np.maximum(gross, 1e-300), 0.0).sum() / max(has.sum(), 1),
        np.abs(adv_sum).max(),
        np.abs(adv_sum).mean(),
        (members == want).mean(),
        corr[2],
        (length * pos).sum() / max(pos.sum(), 1),
        (length * neg).sum() / max(neg.sum(), 1),
    )


def _at(x: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """x[i, cols[i]] per row, the column clamped to x's width."""
    return x[np.arange(len(cols)), np.minimum(cols, x.shape[1] - 1)]


def _model_at(model_head: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(B,) whether row i goes on past its first cols[i] tokens with a model token (for a single-turn
    response: cols[i] < its length)."""
    return (cols < model_head.shape[1]) & _at(model_head, cols)


def _d7(
    ent_head: np.ndarray,
    model_head: np.ndarray,
    in_prefix: np.ndarray,
    row_prefix: np.ndarray,
    groups: HostGroups,
) -> dict[str, float]:
    """D7 on the host part: mean entropy on group-common-prefix positions (model tokens) and at the first
    divergent position where the model chose it (a divergence inside an observation is the environment's,
    not a fork of the policy); ent_head, model_head: the first min(depth + 1, T) columns; the overall mean
    comes from stage 1's row sums."""
    width = in_prefix.shape[1]
    common = (ent_head[:, :width] * in_prefix).sum() / max(in_prefix.sum(), 1)
    diverges = _model_at(model_head, row_prefix) & (groups.counts[groups.inverse] >= 2)
    first_div = _at(ent_head, row_prefix)
    return {
        "diag/d7_entropy_common": common,
        "diag/d7_entropy_divergent": (first_div * diverges).sum() / max(diverges.sum(), 1),
        "diag/d7_common_tokens": in_prefix.sum(),  # what the two means rest on (weights when pooling)
        "diag/d7_divergent_rows": diverges.sum(),
    }


def _shared_depth(lcp: np.ndarray, members: np.ndarray, rows: int) -> np.ndarray:
    """(rows,) how many leading tokens each response shares with some other response of its group: the depth
    of its deepest prefix-tree node that two or more responses pass through."""
    depth = np.zeros(rows, dtype=np.int64)
    real = members >= 0
    depth[members[real]] = lcp.max(axis=2)[real] if lcp.size else 0
    return depth


def _d7_shared(
    ent_head: np.ndarray, model_head: np.ndarray, depth: np.ndarray, groups: HostGroups
) -> dict[str, float]:
    """D7 on shared nodes: mean entropy on positions a response shares with another of its group (t < depth_i)
    and at its fork (t = depth_i, the first token it no longer shares), over responses in groups of two or
    more that go on past their shared part. The group-common prefix needs every response of a group to start
    alike; these need two. Model tokens only, as in `_d7`."""
    cols = np.arange(ent_head.shape[1])[None, :]
    shared = (cols < depth[:, None]) & model_head
    forks = _model_at(model_head, depth) & (groups.counts[groups.inverse] >= 2)
    at_fork = _at(ent_head, depth)
    return {
        "diag/d7_entropy_shared": (ent_head * shared).sum() / max(shared.sum(), 1),
        "diag/d7_entropy_fork": (at_fork * forks).sum() / max(forks.sum(), 1),
        "diag/d7_shared_tokens": shared.sum(),
        "diag/d7_fork_rows": forks.sum(),
    }


def _d10(rows: dict[str, np.ndarray], clipped_prefix: np.ndarray, in_prefix: np.ndarray) -> dict[str, float]:
    """D10: gate/clip fractions for A>0 vs A<0 responses, overall and on group-common prefixes
    (clipped_prefix: the clip indicators on each row's group-common prefix)."""
    crow, n_crow = clipped_prefix.sum(1), in_prefix.sum(1)
    pos, neg = rows["seq_adv"] > 0, rows["seq_adv"] < 0

    def frac(num: np.ndarray, den: np.ndarray, sel: np.ndarray) -> float:
        return (num * sel).sum() / max((den * sel).sum(), 1)

    return {
        "diag/d10_clipfrac_pos": frac(rows["clipped"], rows["tokens"], pos),
        "diag/d10_clipfrac_neg": frac(rows["clipped"], rows["tokens"], neg),
        "diag/d10_clipfrac_common_pos": frac(crow, n_crow, pos),
        "diag/d10_clipfrac_common_neg": frac(crow, n_crow, neg),
    }
