"""Nodes shared by several responses of a group, and D2, the exchangeability residual on them.

A node is a context and a next token (objectives.md sec. 1): responses i and j hold a copy of the same node
at position t iff their first t+1 response tokens agree. D1 looks only at nodes every response of a group
shares; D2 looks at every node with two or more copies, so it also measures partial prefixes (e.g. 3 of 8
answers opening with "The answer is"), which is where real rollouts share tokens. Per node with copies S:

    W = sum_S w  =  kbar * sum_S A   +   sum_S (kappa_i - kbar) * A_i         kappa_i = w_i / A_i
                    \\_ credit          \\_ exchangeability residual

    diag/d2_residual    = sum_nodes |residual| / sum_nodes sum_S |w|     (0 iff every node's copies agree)
    diag/d2_credit_frac = sum_nodes |credit|   / sum_nodes sum_S |w|     (the implicit-PRM signal, not 0)
    diag/d2_shared_frac = sum_nodes sum_S |w|  / sum |w|                 (the share of the step's weight on
                                                                          shared tokens: what D2 applies to)

Groups are compared pairwise: the common-prefix length of every pair of a group (`pairwise_prefix`) says at
which positions two rows are copies of one node, since "shares the first t+1 tokens" is transitive.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcore.groups import GroupIndex
from rlcore.validation import bool_to_float

_FIRST_CHUNK = 16  # columns compared first; each further chunk doubles (shared prefixes are short)


def group_members(groups: GroupIndex) -> Tensor:
    """(n, G_max) row indices of each group's responses in batch order, -1 where a group is smaller."""
    order = torch.argsort(groups.inverse, stable=True)
    starts = torch.cumsum(groups.counts, 0) - groups.counts
    slot = torch.arange(order.numel(), device=order.device) - starts[groups.inverse[order]]
    members = torch.full((groups.n, int(groups.counts.max())), -1, dtype=torch.long, device=order.device)
    members[groups.inverse[order], slot] = order
    return members


def pairwise_prefix(token_ids: Tensor, active: Tensor, members: Tensor) -> Tensor:
    """(n, G, G) number of leading positions where both rows are active (`active`: the response mask, bool
    or 0/1 float) and their token ids agree.

    The diagonal and pairs with a padding slot are 0. Columns are scanned in chunks of growing width and
    the scan stops once every pair has diverged (usually within the first chunk). Comparisons write float
    results: on CPU, bool-valued elementwise ops are several times slower."""
    n, size = members.shape
    width = token_ids.shape[1]
    real = members >= 0
    rows = members.clamp_min(0)
    off_diag = ~torch.eye(size, dtype=torch.bool, device=members.device)
    pair = real[:, :, None] & real[:, None, :] & off_diag  # (n, G, G) pairs worth comparing
    # inactive positions and padding slots get a token id no other slot has, so they never agree
    sentinel = -1 - torch.arange(size, device=members.device)[None, :, None]
    lcp = torch.zeros((n, size, size), dtype=torch.long, device=members.device)
    open_ = pair.clone()  # pairs that have not diverged yet
    start, chunk = 0, _FIRST_CHUNK
    while start < width:
        stop = min(start + chunk, width)
        # float64 ids (exact below 2**53): float comparisons are vectorised on CPU, int64 broadcasts are not
        act = active[rows, start:stop]
        act = act if act.dtype == torch.bool else act != 0
        tok = torch.where(act & real[:, :, None], token_ids[rows, start:stop], sentinel).double()
        differs = torch.empty((n, size, size, stop - start), device=members.device)
        torch.ne(tok[:, :, None, :], tok[:, None, :, :], out=differs)
        hit, first = differs.max(-1)  # the first maximum: the first position where the pair differs
        hit = hit > 0
        lcp = torch.where(open_, torch.where(hit, start + first, torch.full_like(first, stop)), lcp)
        open_ = open_ & ~hit
        if not bool(open_.any()):
            break
        start, chunk = stop, 2 * chunk
    return lcp * pair


def group_common_prefix(lcp: Tensor, members: Tensor) -> Tensor:
    """(n,) length of the prefix every response of a group shares, the smallest of its pairwise ones (0 for a
    lone response); `lcp` as `pairwise_prefix` gives it for `members`."""
    real = members >= 0
    pair = real[:, :, None] & real[:, None, :] & ~torch.eye(members.shape[1], dtype=torch.bool, device=lcp.device)
    none = torch.iinfo(lcp.dtype).max
    shortest = torch.where(pair, lcp, torch.full_like(lcp, none)).flatten(1).amin(1)
    return torch.where(shortest == none, torch.zeros_like(shortest), shortest)


def shared_node_residual(w: Tensor, token_ids: Tensor, active: Tensor, advantages: Tensor,
                         groups: GroupIndex, members: Tensor | None = None, lcp: Tensor | None = None,
                         gross_all: Tensor | None = None) -> dict[str, Tensor]:
    """D2 of one optimizer step from the ascent weights w (B, T), response token ids, the response mask
    (B x T, bool or 0/1 float) and advantages (B,) or (B, T). Values are 0-d tensors; `diag/d2_nodes`
    counts nodes. members, lcp: `group_members` and `pairwise_prefix` of these rows, gross_all: sum |w| over
    the mask, when the caller has them already (each costs a pass over the batch)."""
    if members is None or lcp is None:
        members = group_members(groups)
        lcp = pairwise_prefix(token_ids, active, members)
    depth = int(lcp.max()) if lcp.numel() else 0
    zero = w.new_zeros((), dtype=torch.float64)
    if depth == 0:
        return {"diag/d2_residual": zero, "diag/d2_credit_frac": zero, "diag/d2_shared_frac": zero,
                "diag/d2_nodes": zero, "diag/d2_node_size_mean": zero, "diag/d2_depth_max": zero}
    f64 = torch.float64
    if gross_all is None:  # float and dtype-matched: bool-valued and float64 passes are slow on CPU
        gross_all = (w * (bool_to_float(active, w.dtype) if active.dtype == torch.bool else active)).abs().sum(dtype=f64)
    size = members.shape[1]
    rows = members.clamp_min(0)
    positions = torch.arange(depth, device=w.device)
    real = (members >= 0).to(f64)[:, :, None]

    def gathered(x: Tensor) -> Tensor:  # (B, T) -> (n, depth, G), 0 on padding slots
        return x[rows, :depth].to(f64).mul_(real).transpose(1, 2)

    own = gathered(active)  # (n, depth, G): row b is active at position t
    # copies[n, t, a, b] = 1: rows a and b hold a copy of one node at position t (a itself when it is active)
    copies = torch.empty((lcp.shape[0], depth, size, size), dtype=f64, device=w.device)
    torch.gt(lcp[:, None], positions[None, :, None, None], out=copies)
    copies.diagonal(dim1=2, dim2=3).copy_(own)
    count = copies.sum(3)  # (n, depth, G) copies of the node row a sits on
    first = copies.argmax(3)  # the node's first member
    node = (first == torch.arange(size, device=w.device)).to(f64) * (count >= 2).to(f64) * own

    wm = gathered(w)
    adv = gathered(advantages if advantages.ndim == 2 else advantages[:, None].expand_as(w))
    has_a = (adv != 0).to(f64) * own
    kappa = wm / torch.where(has_a > 0, adv, torch.ones_like(adv)) * has_a
    per_copy = torch.stack([wm, wm.abs(), adv, has_a, kappa], 3)  # (n, depth, G, 5)
    net, gross, adv_sum, n_adv, kappa_sum = torch.matmul(copies, per_copy).unbind(3)  # node sums per member
    credit = kappa_sum / n_adv.clamp_min(1) * adv_sum
    gross_total = (gross * node).sum().clamp_min(1e-300)
    nodes = node.sum()
    return {
        "diag/d2_residual": ((net - credit).abs() * node).sum() / gross_total,
        "diag/d2_credit_frac": (credit.abs() * node).sum() / gross_total,
        "diag/d2_shared_frac": gross_total / gross_all.to(f64).clamp_min(1e-300),
        "diag/d2_nodes": nodes,
        "diag/d2_node_size_mean": (count * node).sum() / nodes.clamp_min(1),
        "diag/d2_depth_max": zero + depth,
    }
