"""Behaviour-policy corrections and their diagnostics (docs/objectives.md#behaviour-policy-corrections).

The engine that sampled a batch (vLLM, another kernel or precision, an older weight version in async mode)
gave each token the log-prob log pi_behaviour; the learner's proximal/old policy gives log pi_old. The
objective keeps its ratio to pi_old for the trust region and multiplies each token's term by a
stop-gradient coefficient built from w_t = pi_old / pi_behaviour (`behaviour_coefficient`), so the
correction is a decoupled objective: exact gradient weights w[i,t] = c[i,t] * kappa[i,t] * A[i,t].

A token-level coefficient depends on (pi_old, pi_behaviour) of that token alone, so copies of a shared
token get equal coefficients exactly when they carry equal log-probs, and cancellation survives; a
sequence-level one depends on the rest of the response and does not. `behaviour_mismatch` measures the
quantity that condition depends on: how far behaviour log-probs of copies of one shared token spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlcore.config import ObjectiveConfig
from rlcore.shared_nodes import F64, SharedPrefixes, compiled, to_host
from rlcore.validation import as_mask, check_finite, check_group_ids, check_tensor

# log of the largest sequence IS weight formed before truncation: a product over thousands of tokens overflows
_MAX_LOG_SEQ_WEIGHT = 20.0


@dataclass(frozen=True)
class BehaviourCoefficient:
    """coef: (B, T) or (B, 1) stop-gradient coefficient of each token's term (1 where nothing is corrected);
    corrected: (B, T) or (B, 1) bool, where the correction truncated or masked the weight."""

    coef: Tensor
    corrected: Tensor


def behaviour_coefficient(
    old: Tensor, behaviour: Tensor, mask: Tensor, lengths: Tensor, cfg: ObjectiveConfig
) -> BehaviourCoefficient:
    """The behaviour correction of `cfg.behaviour_correction` (not 'none') from detached (B, T) log-probs."""
    kind = cfg.behaviour_correction
    log_w = (old - behaviour) * mask  # 0 off the mask
    if kind in ("token_tis", "token_mask"):
        w = torch.exp(log_w)
        if kind == "token_tis":  # truncated IS: min(w_t, C)
            return BehaviourCoefficient(w.clamp(max=cfg.behaviour_cap), w > cfg.behaviour_cap)
        keep = (w >= cfg.behaviour_low) & (
            w <= cfg.behaviour_high
        )  # IcePop: M(w) = w inside the band, else 0
        return BehaviourCoefficient(w * keep, ~keep)
    log_sum = log_w.sum(1, keepdim=True)
    if kind == "seq_tis":  # min(prod_t w_t, C)
        w_seq = torch.exp(log_sum.clamp(max=_MAX_LOG_SEQ_WEIGHT))
    else:  # geometric mean of w_t over the response
        w_seq = torch.exp(log_sum / lengths.clamp_min(1)[:, None])
    if kind == "seq_geo_mask":  # keep or veto the whole response
        keep = (w_seq >= cfg.behaviour_low) & (w_seq <= cfg.behaviour_high)
        return BehaviourCoefficient(keep.to(old.dtype), ~keep)
    return BehaviourCoefficient(w_seq.clamp(max=cfg.behaviour_cap), w_seq > cfg.behaviour_cap)


# Metric names of `BehaviourMismatch.metrics`, their one home (the learner reports them every step).
MISMATCH_KEYS = (
    "mismatch/logprob_abs_diff",
    "mismatch/k3_kl",
    "mismatch/shared_spread_mean",
    "mismatch/shared_spread_max",
    "mismatch/shared_pairs",
)


@dataclass(frozen=True)
class BehaviourMismatch:
    """How the learner's log-probs and the engine's differ on one (micro-)batch.

    tokens: response tokens measured. abs_diff: mean |log pi_old - log pi_behaviour|. k3: mean k3 estimate of
    KL(pi_behaviour || pi_old) (samples come from the engine). shared_pairs: (pair of copies, position)
    entries of shared tokens, two responses of a group agreeing on every token up to there. spread_mean /
    spread_max: mean and largest |log pi_behaviour| difference over them: 0 is the token-level corrections'
    cancellation condition (config.BEHAVIOUR_CONDITION)."""

    tokens: float
    abs_diff: float
    k3: float
    shared_pairs: float
    spread_mean: float
    spread_max: float

    def metrics(self) -> dict[str, float]:
        """Named by MISMATCH_KEYS; pool over micro-batches as means weighted by `weights()`, the max by max."""
        values = (self.abs_diff, self.k3, self.spread_mean, self.spread_max, self.shared_pairs)
        return dict(zip(MISMATCH_KEYS, values, strict=True))

    def weights(self) -> dict[str, float]:
        """The weight of each mean in `metrics()` when pooling parts of a step (counts add up: weight 0)."""
        return {
            "mismatch/logprob_abs_diff": self.tokens,
            "mismatch/k3_kl": self.tokens,
            "mismatch/shared_spread_mean": self.shared_pairs,
        }


def behaviour_mismatch(
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    mask: Tensor,
    token_ids: Tensor,
    group_ids: Tensor,
    *,
    present: Tensor | None = None,
    prefixes: SharedPrefixes | None = None,
) -> BehaviourMismatch:
    """Mismatch of the learner (old_logprobs, (B, T)) and the engine (behaviour_logprobs) on the response
    tokens, and the spread of behaviour log-probs across copies of shared tokens (rlcore.shared_nodes).

    Multi-turn responses: `mask` marks the model's tokens (the engine gives log-probs for those only) and
    `present` every token of the history (default `mask`); copies are found on the history and compared on
    model tokens. `prefixes`: that comparison already made for these rows (the learner's diagnostics share it)."""
    check_tensor("old_logprobs", old_logprobs, ndim=2)
    shape = tuple(old_logprobs.shape)
    check_tensor("behaviour_logprobs", behaviour_logprobs, shape)
    check_tensor("token_ids", token_ids, shape, kind="int")
    group_ids = check_group_ids(group_ids, shape[0])
    mf = as_mask("mask", mask, shape, torch.float64)
    old = old_logprobs.detach().to(torch.float64)
    beh = behaviour_logprobs.detach().to(torch.float64)
    check_finite("old_logprobs", old)
    check_finite("behaviour_logprobs", beh)
    n = float(mf.sum())
    r = (old - beh) * mf
    abs_diff = float(r.abs().sum()) / max(n, 1.0)
    k3 = float(((torch.exp(r) - 1 - r) * mf).sum()) / max(n, 1.0)
    if present is not None:
        check_tensor("present", present, shape, kind="mask")
    if prefixes is None:
        prefixes = SharedPrefixes.of(token_ids, mask if present is None else present, group_ids)
    else:
        prefixes.check(group_ids)
    depth = prefixes.depth
    total = peak = pairs = 0.0
    if depth > 0:
        total, peak, pairs = _pair_spread(
            to_host(beh[:, :depth], F64), to_host(mf[:, :depth]) != 0, prefixes.groups.members, prefixes.lcp
        )
    return BehaviourMismatch(
        tokens=n,
        abs_diff=abs_diff if n else float("nan"),
        k3=k3 if n else float("nan"),
        shared_pairs=pairs,
        spread_mean=total / pairs if pairs else 0.0,
        spread_max=peak,
    )


@compiled()
def _pair_spread(beh: np.ndarray, model: np.ndarray, members: np.ndarray, lcp: np.ndarray) -> Any:
    """Sum and max of |beh[a, t] - beh[b, t]| over pairs of a group's responses and t < lcp[a, b] where both
    hold a model token (`model`), and the number of such entries (lcp is 0 for padding slots)."""
    total = peak = count = 0.0
    size = members.shape[1]
    for g in range(members.shape[0]):
        for a in range(size):
            for b in range(a + 1, size):
                shared = lcp[g, a, b]
                if shared == 0:
                    continue
                ra, rb = members[g, a], members[g, b]
                for t in range(shared):
                    if not (model[ra, t] and model[rb, t]):
                        continue
                    d = abs(beh[ra, t] - beh[rb, t])
                    total += d
                    peak = max(peak, d)
                    count += 1.0
    return total, peak, count
