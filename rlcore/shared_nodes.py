"""Nodes shared by several responses of a group, and D2, the exchangeability residual on them.

A node is a context and a next token (docs/objectives.md#shared-nodes-and-cancellation): responses i and j
hold a copy of the same node
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

Multi-turn responses (docs/objectives.md#multi-turn-credit) hold observation tokens (tool output, template
tokens the environment inserts) between the model's segments: the loss mask has holes. A node's context is the
whole token history, so prefixes are compared over every token present (`present`: model and observation
tokens), and the sums are taken over model tokens only (`active`, the loss mask): an identical tool output
extends a shared prefix, but it carries no weight of its own. `SharedPrefixes` is one such comparison of a
batch, computed once and read by every diagnostic of the step.

Everything here works on small host arrays (B rows, G x G pairs, the shared depth of a few dozen columns)
in loops compiled by numba: at these sizes each torch call would cost more in dispatch than its arithmetic,
and on a GPU learner one transfer of a small slice replaces many tiny kernel launches. Inputs may be torch
tensors on any device or numpy arrays; only the columns that are scanned are copied. The kernels compile
on first use (~10 s) and are cached on disk afterwards (see `compiled`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit


def compiled(**options: Any) -> Callable[[Callable], Callable]:
    """numba's `njit`, cached on disk (beside the module, else in the user's cache directory); where neither
    is writable (a read-only install without a home) it compiles once per process instead of failing."""

    def wrap(fn: Callable) -> Callable:
        try:
            return njit(cache=True, **options)(fn)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return njit(**options)(fn)

    return wrap


_FIRST_CHUNK = 64  # columns compared first; each further chunk doubles (shared prefixes are short)
F64 = np.float64


def to_host(x: Any, dtype: Any = None) -> np.ndarray:
    """A C-contiguous numpy view (contiguous CPU tensors, arrays) or copy (other devices, strides, dtype
    changes) of a tensor or array; one memory layout per dtype keeps the compiled kernels to one each."""
    if hasattr(x, "detach"):
        x = x.detach()
        x = x.numpy() if x.device.type == "cpu" else x.cpu().numpy()
    return np.ascontiguousarray(x, dtype=dtype)


@dataclass(frozen=True)
class HostGroups:
    """Dense groups of a batch: `inverse[i]` is row i's group in 0..n-1 (ids sorted), `counts[g]` its size,
    `members[g]` its rows in batch order padded with -1 to the largest group."""

    inverse: np.ndarray
    counts: np.ndarray
    members: np.ndarray

    @classmethod
    def of(cls, group_ids: Any) -> HostGroups:
        return cls(*_dense_groups(to_host(group_ids, np.int64)))

    @property
    def n(self) -> int:
        return int(self.counts.size)


@compiled()
def _dense_groups(group_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.unique(group_ids)
    inverse = np.searchsorted(ids, group_ids)
    counts = np.zeros(ids.size, dtype=np.int64)
    for g in inverse:
        counts[g] += 1
    members = np.full((ids.size, counts.max()), -1, dtype=np.int64)
    fill = np.zeros(ids.size, dtype=np.int64)
    for row, g in enumerate(inverse):
        members[g, fill[g]] = row
        fill[g] += 1
    return inverse, counts, members


def pairwise_prefix(token_ids: Any, present: Any, members: Any) -> np.ndarray:
    """(n, G, G) number of leading positions where both rows hold a token (`present`, bool or 0/1: the
    response mask of single-turn responses, every model and observation token of multi-turn ones) and
    their token ids agree.

    The diagonal and pairs with a padding slot are 0. Columns are scanned in chunks of growing width (each
    chunk alone is copied to the host) and the scan stops once every pair has diverged (usually within the
    first chunk)."""
    members = to_host(members, np.int64)
    width = token_ids.shape[1]
    lcp = np.zeros((members.shape[0], members.shape[1], members.shape[1]), dtype=np.int64)
    open_ = _real_pairs(members)  # pairs that have not diverged yet
    start, chunk = 0, _FIRST_CHUNK
    while start < width:
        stop = min(start + chunk, width)
        tok = to_host(token_ids[:, start:stop], np.int64)
        act = to_host(present[:, start:stop]) != 0
        if not _scan_chunk(tok, act, members, start, lcp, open_):
            break
        start, chunk = stop, 2 * chunk
    return lcp


def _real_pairs(members: np.ndarray) -> np.ndarray:
    real = members >= 0
    return real[:, :, None] & real[:, None, :] & ~np.eye(members.shape[1], dtype=bool)


@compiled()
def _scan_chunk(
    tok: np.ndarray, act: np.ndarray, members: np.ndarray, start: int, lcp: np.ndarray, open_: np.ndarray
) -> bool:
    """Advance `lcp` of the open pairs over columns start..start+c (tok, act: (B, c)); True while any pair is
    still open at the chunk's end."""
    any_open = False
    for g in range(members.shape[0]):
        for a in range(members.shape[1]):
            for b in range(a + 1, members.shape[1]):
                if not open_[g, a, b]:
                    continue
                ra, rb = members[g, a], members[g, b]
                j = 0
                while j < tok.shape[1] and act[ra, j] and act[rb, j] and tok[ra, j] == tok[rb, j]:
                    j += 1
                lcp[g, a, b] = lcp[g, b, a] = start + j
                if j < tok.shape[1]:
                    open_[g, a, b] = open_[g, b, a] = False
                else:
                    any_open = True
    return any_open


@dataclass(frozen=True)
class SharedPrefixes:
    """The pairwise common prefixes of one batch's groups: `groups` (HostGroups of its group ids) and `lcp`
    (`pairwise_prefix` over its present tokens). One scan of the token ids serves D1, D2, the behaviour
    mismatch and IBPO's symmetric mask of the same rows."""

    groups: HostGroups
    lcp: np.ndarray

    @classmethod
    def of(cls, token_ids: Any, present: Any, group_ids: Any) -> SharedPrefixes:
        """token_ids and present (B, T): the response columns and which of them hold a token."""
        if tuple(present.shape) != tuple(token_ids.shape):
            raise ValueError(
                f"present: expected the shape of token_ids {tuple(token_ids.shape)}, got {tuple(present.shape)}"
            )
        groups = HostGroups.of(group_ids)
        return cls(groups, pairwise_prefix(token_ids, present, groups.members))

    @property
    def depth(self) -> int:
        """The deepest position any two rows of a group share (0: nothing shared)."""
        return int(self.lcp.max()) if self.lcp.size else 0

    def check(self, group_ids: Any) -> None:
        """ValueError unless these prefixes were computed for rows with `group_ids` (the same rows, in order)."""
        inverse = to_host(group_ids, np.int64)
        ids = np.unique(inverse)
        if inverse.shape != self.groups.inverse.shape or not np.array_equal(
            np.searchsorted(ids, inverse), self.groups.inverse
        ):
            raise ValueError(
                "prefixes: computed for other rows than these group_ids; build them with "
                "SharedPrefixes.of(token_ids, present, group_ids) of this batch"
            )


def group_common_prefix(lcp: np.ndarray, members: np.ndarray) -> np.ndarray:
    """(n,) length of the prefix every response of a group shares, the smallest of its pairwise ones (0 for a
    lone response); `lcp` as `pairwise_prefix` gives it for `members`."""
    none = np.iinfo(np.int64).max
    shortest = np.where(_real_pairs(members), lcp, none).reshape(lcp.shape[0], -1).min(1)
    return np.where(shortest == none, 0, shortest)


def node_residual(
    w: np.ndarray,
    active: np.ndarray,
    advantages: np.ndarray,
    members: np.ndarray,
    lcp: np.ndarray,
    gross_all: float,
) -> dict[str, float]:
    """D2 from host arrays: w and active (B, >= depth) float64 (w zero off the mask), advantages (B,) or
    (B, >= depth), `members`/`lcp` of these rows, gross_all = sum |w| over the whole batch."""
    depth = int(lcp.max()) if lcp.size else 0
    if depth == 0:
        return dict.fromkeys(
            (
                "diag/d2_residual",
                "diag/d2_credit_frac",
                "diag/d2_shared_frac",
                "diag/d2_nodes",
                "diag/d2_node_size_mean",
                "diag/d2_depth_max",
            ),
            0.0,
        )
    adv = advantages[:, :depth] if advantages.ndim == 2 else np.repeat(advantages[:, None], depth, 1)
    residual, credit, gross, nodes, copies = _node_sums(
        np.ascontiguousarray(w[:, :depth], dtype=F64),
        np.ascontiguousarray(active[:, :depth] != 0),
        np.ascontiguousarray(adv, dtype=F64),
        members,
        lcp,
    )
    gross = max(gross, 1e-300)
    return {
        "diag/d2_residual": residual / gross,
        "diag/d2_credit_frac": credit / gross,
        "diag/d2_shared_frac": gross / max(float(gross_all), 1e-300),
        "diag/d2_nodes": nodes,
        "diag/d2_node_size_mean": copies / max(nodes, 1.0),
        "diag/d2_depth_max": float(depth),
    }


@compiled()
def _node_sums(
    w: np.ndarray, active: np.ndarray, adv: np.ndarray, members: np.ndarray, lcp: np.ndarray
) -> tuple[float, float, float, float, float]:
    """Sums over every node with >= 2 copies: |residual|, |credit|, gross |w|, node count, copy count.
    The node of member a at position t holds a and every b with lcp[a, b] > t that is active there (a model
    token; an observation token with the same history is no copy of a weight); it is visited from its first
    active member (the lowest slot)."""
    residual = credit = gross = nodes = copies = 0.0
    size = members.shape[1]
    for g in range(members.shape[0]):
        for t in range(w.shape[1]):
            for a in range(size):
                ra = members[g, a]
                if ra < 0 or not active[ra, t]:
                    continue
                first = True
                for b in range(a):
                    if lcp[g, a, b] > t and active[members[g, b], t]:
                        first = False
                        break
                if not first:
                    continue
                count, net, gsum, adv_sum, n_adv, kappa_sum = 0, 0.0, 0.0, 0.0, 0, 0.0
                for b in range(size):
                    if b == a or (lcp[g, a, b] > t and active[members[g, b], t]):
                        rb = members[g, b]
                        x, a_b = w[rb, t], adv[rb, t]
                        count += 1
                        net += x
                        gsum += abs(x)
                        adv_sum += a_b
                        if a_b != 0:
                            n_adv += 1
                            kappa_sum += x / a_b
                if count < 2:
                    continue
                c = kappa_sum / max(n_adv, 1) * adv_sum
                residual += abs(net - c)
                credit += abs(c)
                gross += gsum
                nodes += 1
                copies += count
    return residual, credit, gross, nodes, copies


def shared_node_residual(
    w: Any, token_ids: Any, active: Any, advantages: Any, group_ids: Any, present: Any = None
) -> dict[str, float]:
    """D2 of one optimizer step from the ascent weights w (B, T), response token ids, the response (loss)
    mask (B x T, bool or 0/1) and advantages (B,) or (B, T); tensors or arrays. `present`: the tokens of the
    history where the loss mask has holes (multi-turn); default the mask. `diag/d2_nodes` counts nodes."""
    prefixes = SharedPrefixes.of(token_ids, active if present is None else present, group_ids)
    mask = to_host(active, F64)
    wm = to_host(w, F64) * mask
    return node_residual(
        wm, mask, to_host(advantages, F64), prefixes.groups.members, prefixes.lcp, float(np.abs(wm).sum())
    )
