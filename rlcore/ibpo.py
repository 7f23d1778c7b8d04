"""IBPO (arXiv 2605.16302): counterfactual compare-and-correct credit, and its edit mask made cancellation-safe.

The trainer generates, for each incorrect response y_i of a group with a correct sibling, a revision y^_i from
(prompt, y_i, correct reference(s)) with the current policy and scores it; this module holds the tensor parts:

    phi = comparison_signal(correct, revised_correct, attempted, rho)        # rho * 1[r(y)=0 and r(y^)=1]
    adv = shaped_advantages(cfg, rewards, group_ids, mask, phi, lam)         # R' = R + lam*phi, then centring
    edits = edit_mask(y_ids, revision_ids)                                   # Levenshtein over token ids
    edits = segment_edit_mask(y_ids, rev_ids, y_model, rev_model)            # multi-turn: model tokens only
    naive = naive_credit_mask(edits_per_row, mask)                           # the edit mask on its rows only
    sym = symmetric_credit_mask(naive, token_ids, mask, group_ids)           # one decision per shared node
    adv_tok = adv[:, None] * sym                                             # (B, T) advantages for the loss

Why two masks: a node (context + next token) shared by several responses of a group cancels only if every
copy carries the same coefficient (docs/objectives.md#shared-nodes-and-cancellation). The naive edit mask is response-coupled: an incorrect
response whose revision kept a shared prefix loses its negative copies there while a correct sibling keeps its
positive ones, so the prefix is pushed up whatever it is worth. `symmetric_credit_mask` makes the decision per
node: a node keeps its credit if any of its copies keeps it (so group-common prefixes are never masked and
keep their Monte-Carlo credit kbar * sum A); tokens no sibling shares keep the naive decision.

The mask is a coefficient of w, not a change of the advantage: the diagnostics must read the unmasked (B,)
advantages (see `mask_diagnostics`), or D2 would take a masked copy for an advantage of 0 and call the
imbalance credit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlcore.advantages import group_advantages
from rlcore.config import ObjectiveConfig, TrajectoryCredit, cancellation_verdict
from rlcore.shared_nodes import SharedPrefixes, compiled, to_host

MASKS = ("none", "naive", "symmetric")
MAX_ALIGN_CELLS = 1 << 24  # DP cells of one alignment (64 MiB of int32) after the common ends are trimmed


def comparison_signal(
    correct: Tensor, revised_correct: Tensor, attempted: Tensor, rho: float = 0.5
) -> Tensor:
    """(B,) phi_i = rho * 1[y_i incorrect and its revision correct]; 0 where no revision was attempted.

    correct, revised_correct, attempted: (B,) bool (revised_correct is ignored where attempted is False)."""
    for name, x in (("correct", correct), ("revised_correct", revised_correct), ("attempted", attempted)):
        if not isinstance(x, Tensor) or x.ndim != 1 or x.shape != correct.shape:
            raise ValueError(
                f"{name}: expected a (B,) tensor like `correct`, got {getattr(x, 'shape', type(x).__name__)}"
            )
    if not 0.0 <= rho:
        raise ValueError(f"rho: must be >= 0, got {rho}")
    hit = ~correct.bool() & attempted.bool() & revised_correct.bool()
    return hit.to(torch.float32) * rho


def shaped_advantages(
    cfg: ObjectiveConfig,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    phi: Tensor,
    lam: float,
    keep: Tensor | None = None,
) -> Tensor:
    """(B,) advantages of R' = R + lam * phi, centred (and scaled) per group like the objective's own: the
    shaping comes before centring, so every group's A' still sums to 0 (rlcore.advantages' bonus hook).
    keep: (B,) bool, the responses that enter the centring (multi-turn: failed trajectories are filtered
    before centring, never after; the others get A' = 0)."""
    return group_advantages(
        rewards, group_ids, mask, dataclasses.replace(cfg, bonus_coef=float(lam)), bonus=phi, keep=keep
    )


# -- alignment ----------------------------------------------------------------------------------------


def edit_mask(response: Sequence[int], revision: Sequence[int]) -> np.ndarray:
    """(len(response),) bool: True for each token of `response` that a Levenshtein alignment with `revision`
    does not keep unchanged (IBPO's m_t = 1[t not in U]).

    Substituted and deleted tokens are edited. An insertion edits no token of `response`; it is charged to the
    token right after the insertion point (the token emitted where the revision put something else), or to
    the last token when the revision appends. Of the optimal alignments, the one that matches tokens as late
    as possible is taken (backtrace from the end prefers a match), after the common prefix and suffix, which
    every optimal alignment can keep, are set aside. A middle part longer than MAX_ALIGN_CELLS cells is
    marked edited whole."""
    a = np.asarray(response, dtype=np.int64).reshape(-1)
    b = np.asarray(revision, dtype=np.int64).reshape(-1)
    out = np.zeros(a.size, dtype=bool)
    if a.size == 0:
        return out
    head = 0
    while head < min(a.size, b.size) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(a.size, b.size) - head and a[a.size - 1 - tail] == b[b.size - 1 - tail]:
        tail += 1
    ma, mb = a[head : a.size - tail], b[head : b.size - tail]
    if ma.size == 0:
        if mb.size:  # a pure insertion between the kept ends
            out[min(head, a.size - 1)] = True
        return out
    if mb.size == 0:
        out[head : a.size - tail] = True
        return out
    if (ma.size + 1) * (mb.size + 1) > MAX_ALIGN_CELLS:
        out[head : a.size - tail] = True
        return out
    middle = _align(ma, mb)
    out[head : a.size - tail] = middle[: ma.size]
    if middle[ma.size]:  # an insertion at the end of the middle charges the first kept tail token
        out[min(a.size - tail, a.size - 1)] = True
    return out


@compiled()
def _align(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a) + 1,) bool: edited tokens of a, plus one slot for an insertion after its last token."""
    n, m = a.size, b.size
    d = np.empty((n + 1, m + 1), dtype=np.int32)
    for i in range(n + 1):
        d[i, 0] = i
    for j in range(m + 1):
        d[0, j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            sub = d[i - 1, j - 1] + (0 if a[i - 1] == b[j - 1] else 1)
            d[i, j] = min(sub, d[i - 1, j] + 1, d[i, j - 1] + 1)
    edited = np.zeros(n + 1, dtype=np.bool_)
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0 and a[i - 1] == b[j - 1] and d[i, j] == d[i - 1, j - 1]:
            i -= 1
            j -= 1
        elif i > 0 and j > 0 and d[i, j] == d[i - 1, j - 1] + 1:
            edited[i - 1] = True
            i -= 1
            j -= 1
        elif i > 0 and d[i, j] == d[i - 1, j] + 1:
            edited[i - 1] = True
            i -= 1
        else:  # b[j-1] inserted before a[i]
            edited[i] = True
            j -= 1
    return edited


def segment_edit_mask(
    response: Sequence[int],
    revision: Sequence[int],
    response_model: Sequence[bool] | None = None,
    revision_model: Sequence[bool] | None = None,
) -> np.ndarray:
    """(len(response),) bool: `edit_mask` of a multi-turn response against a multi-turn revision, aligned
    over model tokens only. response_model / revision_model say which tokens the model sampled (None: all,
    a single-turn response); observation tokens (tool output, feedback, template tokens) are dropped from
    both sides before the alignment and come back False: they were never the policy's choice, so they never
    get credit, and an observation that differs (a tool's other output) is not an edit. On one segment this
    is `edit_mask` itself. Model turns are aligned as one sequence, so an insertion at a turn's end is charged
    to the next turn's first model token."""
    a = np.asarray(response, dtype=np.int64).reshape(-1)
    b = np.asarray(revision, dtype=np.int64).reshape(-1)
    keep_a = _model_positions("response_model", response_model, a.size)
    keep_b = _model_positions("revision_model", revision_model, b.size)
    out = np.zeros(a.size, dtype=bool)
    out[keep_a] = edit_mask(a[keep_a], b[keep_b])
    return out


def _model_positions(name: str, model: Sequence[bool] | None, n: int) -> np.ndarray:
    if model is None:
        return np.ones(n, dtype=bool)
    m = np.asarray(model, dtype=bool).reshape(-1)
    if m.size != n:
        raise ValueError(f"{name}: {m.size} entries for {n} token ids (one per token, True where sampled)")
    return m


def levenshtein(a: Sequence[int], b: Sequence[int]) -> int:
    """Edit distance of two token-id sequences (for tests and metrics)."""
    x, y = np.asarray(a, dtype=np.int64).reshape(-1), np.asarray(b, dtype=np.int64).reshape(-1)
    prev = np.arange(y.size + 1)
    for i in range(1, x.size + 1):
        cur = np.empty_like(prev)
        cur[0] = i
        for j in range(1, y.size + 1):
            cur[j] = min(prev[j - 1] + (x[i - 1] != y[j - 1]), prev[j] + 1, cur[j - 1] + 1)
        prev = cur
    return int(prev[-1])


# -- credit masks -------------------------------------------------------------------------------------


def naive_credit_mask(edits: Sequence[np.ndarray | Sequence[bool] | None], mask: Tensor) -> Tensor:
    """(B, T) float: the response mask, with row i replaced by its edit mask where edits[i] is not None (the
    incorrect responses whose revision succeeded: only their edited tokens keep credit). edits[i] has one
    entry per model token of row i, in order (a multi-turn row's mask has holes: observations stay 0)."""
    if len(edits) != mask.shape[0]:
        raise ValueError(
            f"edits: expected {mask.shape[0]} entries (one per row, None to keep a row), got {len(edits)}"
        )
    out = mask.detach().to(torch.float32).clone()
    for i, e in enumerate(edits):
        if e is None:
            continue
        row = torch.as_tensor(np.asarray(e, dtype=np.float32))
        model = out[i] != 0
        n = int(model.sum().item())
        if row.numel() != n:
            raise ValueError(f"edits[{i}]: {row.numel()} entries for a response of {n} model tokens")
        out[i, model] = row
    return out


def symmetric_credit_mask(
    naive: Tensor, token_ids: Tensor, mask: Tensor, group_ids: Tensor, present: Tensor | None = None
) -> Tensor:
    """(B, T) float: one decision per node shared inside a group (a node keeps credit if any copy keeps it
    under `naive`); positions no sibling shares keep the naive decision; 0 off the response mask.
    present: every token of a multi-turn history (default `mask`): nodes are shared on the history."""
    out = to_host(naive, np.float64).copy()
    active = to_host(mask, np.float64)
    prefixes = SharedPrefixes.of(token_ids, mask if present is None else present, group_ids)
    members, lcp = prefixes.groups.members, prefixes.lcp
    for g in range(members.shape[0]):
        rows = members[g][members[g] >= 0]
        k = rows.size
        pairs = lcp[g, :k, :k]
        depth = int(pairs.max()) if pairs.size else 0
        if depth == 0:
            continue
        share = pairs[:, :, None] > np.arange(depth)[None, None, :]  # (k, k, depth): b holds a's node at t
        share[np.arange(k), np.arange(k), :] = True
        sub = out[rows, :depth]
        out[rows, :depth] = (share * sub[None, :, :]).max(axis=1) * active[rows, :depth]
    return torch.from_numpy(out * active).to(torch.float32)


def credit_mask(
    variant: str,
    edits: Sequence[np.ndarray | None],
    token_ids: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    present: Tensor | None = None,
) -> Tensor:
    """(B, T) float credit mask of `variant` (none: the response mask); present as in `symmetric_credit_mask`."""
    if variant not in MASKS:
        raise ValueError(f"mask: {variant!r} is not one of {', '.join(MASKS)}")
    if variant == "none":
        return mask.detach().to(torch.float32)
    naive = naive_credit_mask(edits, mask)
    return naive if variant == "naive" else symmetric_credit_mask(naive, token_ids, mask, group_ids, present)


def verdict(
    cfg: ObjectiveConfig, variant: str, credit: TrajectoryCredit | None = None
) -> tuple[bool, list[str]]:
    """`cancellation_verdict` of the objective with IBPO's credit mask `variant` on top. Shaping alone keeps
    the objective's verdict (it comes before centring); the naive edit mask breaks it.

    credit: the multi-turn credit rule (None: single-turn). With the default `TrajectoryCredit()` IBPO keeps
    cancellation across turns exactly where it keeps it in one turn: phi is one number per trajectory, added
    to its reward before the group is centred (failed trajectories filtered before that), and the centred A'
    is broadcast to every model token with the objective's step-constant normaliser, so every copy of a node
    still carries the same coefficient; the symmetric mask is decided per node of the whole history
    (observations included), so copies of a node share its decision. A per-turn or per-trajectory
    normaliser, a per-turn split of R + lam*phi, or a filter after centring breaks it, and the reasons say
    which (`TrajectoryCredit.reasons`)."""
    if variant not in MASKS:
        raise ValueError(f"mask: {variant!r} is not one of {', '.join(MASKS)}")
    ok, reasons = cancellation_verdict(cfg, credit)
    reasons = list(reasons)
    if variant == "naive":
        reasons.append(
            "IBPO mask='naive' zeroes the unchanged tokens of repaired incorrect responses only, so a "
            "node shared with a correct sibling keeps its positive copies and loses negative ones; use "
            "mask='symmetric'"
        )
    if variant != "none" and cfg.seq_transform == "orth":
        reasons.append(
            "seq_transform='orth' orthogonalises the per-response weights against each row's mean "
            "advantage, which a token mask changes, so group-common nodes no longer cancel; use "
            "mask='none' or another preset"
        )
    return (ok and not (variant == "naive" or (variant != "none" and cfg.seq_transform == "orth")), reasons)


# -- diagnostics on a real batch ----------------------------------------------------------------------

_DIAG_KEYS = (
    "diag/d1_gcpr",
    "diag/d1_groups_measured",
    "diag/d2_residual",
    "diag/d2_credit_frac",
    "diag/d2_nodes",
)


def mask_diagnostics(
    objective: Any,
    advantages: Tensor,
    credit: Tensor,
    logprobs: Tensor,
    token_ids: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    present: Tensor | None = None,
) -> dict[str, float]:
    """D1/D2 of the step's ascent weights with the credit mask applied, read against the unmasked (B,)
    advantages (the mask is a coefficient of w). The weights are those of the first on-policy pass
    (current = sampling log-probs `logprobs`, ratio 1): no second model pass is needed. present: as in
    `symmetric_credit_mask`."""
    from rlcore.diagnostics import ascent_weights, cancellation_diagnostics

    lp = logprobs.detach().to(torch.float64)
    adv_tok = advantages.detach().to(torch.float64)[:, None] * credit.to(torch.float64)
    w, _ = ascent_weights(objective, lp, lp, adv_tok, mask, group_ids)
    diag = cancellation_diagnostics(
        w, token_ids, mask, group_ids, advantages.detach().to(torch.float64), present=present
    )
    return {k.removeprefix("diag/"): diag[k] for k in _DIAG_KEYS}
