"""The objective's knobs: one frozen dataclass whose field metadata is the documentation.

Torch-free on purpose: the control plane validates objective names and overrides with it.
Every knob says what it does, its default and the paper it comes from; `describe_knobs()` prints them.
The math behind each knob and its effect on cancellation is in docs/objectives.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ADV_BASELINES = ("mean", "loo")
ADV_SCALES = ("group_std", "none", "batch_std", "batch_whiten")
RATIOS = ("token", "sequence", "geo_mean", "truncated", "none")
GATES = ("ppo", "dual", "symmetric", "none")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "constant")
SEQ_TRANSFORMS = ("none", "min_replace", "orth")
KL_ESTIMATORS = ("k1", "k2", "k3")
BEHAVIOUR_CORRECTIONS = ("none", "token_tis", "token_mask", "seq_tis", "seq_geo_tis", "seq_geo_mask")
TOKEN_CORRECTIONS = ("token_tis", "token_mask")  # node-local: keep cancellation under BEHAVIOUR_CONDITION
# When a token-level behaviour correction keeps cancellation (docs/objectives.md#behaviour-policy-corrections).
BEHAVIOUR_CONDITION = (
    "copies of a shared token carry equal behaviour log-probs (and equal proximal log-probs, which the "
    "learner's shared forward gives); mismatch/shared_spread_max measures it"
)


def _knob(
    default: Any,
    doc: str,
    *,
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    optional: bool = False,
) -> Any:
    """A dataclass field carrying its documentation and its valid range (checked by `validate`)."""
    meta = {
        "doc": doc,
        "choices": choices,
        "low": low,
        "high": high,
        "low_open": low_open,
        "optional": optional,
    }
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ObjectiveConfig:
    """Resolved knobs of one objective. Every objective is `w[i,t] = kappa[i,t] * A[i,t]` (docs/objectives.md#per-token-weights)."""

    # -- advantages ---------------------------------------------------------------------------------
    adv_baseline: str = _knob(
        "mean",
        "Group baseline subtracted from the reward. `mean`: A = R - mean_group(R) (GRPO, arXiv 2402.03300); "
        "`loo`: leave-one-out A = R - mean_{j!=i} R_j = G/(G-1) (R - mean) (RLOO, arXiv 2402.14740). "
        "Both are centred (sum_i A_i = 0), the precondition of cancellation (docs/objectives.md#shared-nodes-and-cancellation). "
        "Default `mean`.",
        choices=ADV_BASELINES,
    )
    adv_scale: str = _knob(
        "group_std",
        "Scale of the centred advantage. `group_std`: divide by the group's std (GRPO); `none`: no scaling "
        "(Dr. GRPO, arXiv 2503.20783); `batch_std`: divide by the token-weighted std over the whole step, "
        "without a mean shift (REINFORCE++-baseline made cancellation-preserving, arXiv 2501.03262); "
        "`batch_whiten`: verl's masked_whiten, also subtracting the token-weighted batch mean "
        "(breaks cancellation: group sums become -G mu/sigma). Default `group_std`.",
        choices=ADV_SCALES,
    )
    adv_eps: float = _knob(
        1e-6, "Added to every std before dividing (verl's epsilon). Default 1e-6.", low=0.0, low_open=True
    )
    bonus_coef: float = _knob(
        1.0,
        "Weight lambda of the reward bonus passed to `advantages(..., bonus=)`, added to R before centring "
        "(IBPO-style shaping R' = R + lambda * phi, arXiv 2605.16302 uses lambda ~ 0.6; docs/objectives.md#group-relative-advantages). Default 1.0.",
    )
    # -- ratio / importance weight ------------------------------------------------------------------
    ratio: str = _knob(
        "token",
        "Importance weight of a token. `token`: r = pi/pi_old with gradient (PPO/GRPO); `sequence`: GSPO's "
        "s_i = exp(mean_t log r) broadcast to the response's tokens (arXiv 2507.18071, GSPO-token form); "
        "`geo_mean`: GMPO's geometric mean of log-space-clipped token ratios (arXiv 2507.20673); "
        "`truncated`: stop-gradient sg(clip(r, is_min, is_max)) times log pi (CISPO, arXiv 2506.13585); "
        "`none`: plain log pi (on-policy REINFORCE). Default `token`.",
        choices=RATIOS,
    )
    is_min: float = _knob(
        0.0,
        "Lower truncation bound of the IS weight for ratio=`truncated` (absolute ratio "
        "value; 0 disables it, as in CISPO). Default 0.0.",
        low=0.0,
    )
    is_max: float = _knob(
        5.0,
        "Upper truncation bound of the IS weight for ratio=`truncated` (absolute ratio "
        "value; CISPO's epsilon_high cap). Default 5.0.",
        low=0.0,
        low_open=True,
    )
    # -- behaviour-policy correction ----------------------------------------------------------------
    behaviour_correction: str = _knob(
        "none",
        "Correction for the engine that sampled the batch (its log-probs, `behaviour_logprobs`), with "
        "w_t = exp(log pi_old - log pi_behaviour), a stop-gradient coefficient on top of the ratio/gate "
        "(decoupled objective: the ratio to pi_old keeps the trust region). `token_tis`: min(w_t, "
        "behaviour_cap) (truncated IS, verl/TRL token_truncate); `token_mask`: w_t inside [behaviour_low, "
        "behaviour_high], else 0 (IcePop, arXiv 2510.18855); `seq_tis`: min(prod_t w_t, behaviour_cap) on "
        "every token of the response; `seq_geo_tis`: min(geometric mean of w_t, behaviour_cap); "
        "`seq_geo_mask`: 1 if the geometric mean is inside [behaviour_low, behaviour_high], else 0 (verl's "
        "geometric rejection). Token-level ones keep cancellation when copies of a shared token carry equal "
        "behaviour log-probs; sequence-level ones do not (docs/objectives.md#behaviour-policy-corrections). "
        "Default `none`.",
        choices=BEHAVIOUR_CORRECTIONS,
    )
    behaviour_cap: float = _knob(
        2.0,
        "C of `token_tis`, `seq_tis`, `seq_geo_tis`: the behaviour IS weight is min(w, C). Default 2.0.",
        low=0.0,
        low_open=True,
    )
    behaviour_low: float = _knob(
        0.5,
        "Lower bound of the kept band of `token_mask` (w_t) and `seq_geo_mask` (geometric mean). IcePop 0.5. "
        "Default 0.5.",
        low=0.0,
    )
    behaviour_high: float = _knob(
        2.0,
        "Upper bound of the kept band of `token_mask` and `seq_geo_mask`. IcePop 2.0. Default 2.0.",
        low=0.0,
        low_open=True,
    )
    # -- gate ---------------------------------------------------------------------------------------
    gate: str = _knob(
        "ppo",
        "Trust-region gate. `ppo`: min(rA, clip(r, 1-clip_low, 1+clip_high)A), active band depends on "
        "sign(A) (arXiv 1707.06347; breaks cancellation when it bites, docs/objectives.md#sign-dependent-clipping); `dual`: ppo "
        "plus the dual "
        "clip -c*A for A<0 (arXiv 1912.09729); `symmetric`: zero the gradient of every copy whose ratio "
        "leaves the band, whatever the sign of A (keeps exchangeability); `none`. For "
        "ratio=`sequence` the gate acts on s_i, for `geo_mean` on log r in log space. Default `ppo`.",
        choices=GATES,
    )
    clip_low: float = _knob(
        0.2,
        "eps_low of the gate band [1-eps_low, 1+eps_high] (log-space bound for "
        "geo_mean). PPO/GRPO 0.2, GSPO 3e-4, GMPO 0.4. Default 0.2.",
        low=0.0,
        high=1.0,
    )
    clip_high: float = _knob(
        0.2,
        "eps_high of the gate band; DAPO's clip-higher uses 0.28 (arXiv 2503.14476), "
        "GSPO 4e-4, GMPO 0.4. Default 0.2.",
        low=0.0,
    )
    dual_clip_c: float = _knob(
        3.0,
        "Dual-clip constant c (> 1) for gate=`dual`: the loss of an A<0 token is "
        "capped at -c*A (verl clip_ratio_c). Default 3.0.",
        low=1.0,
        low_open=True,
    )
    # -- aggregation --------------------------------------------------------------------------------
    aggregation: str = _knob(
        "seq_mean_token_mean",
        "How token terms are summed into the loss. `seq_mean_token_mean`: 1/(N_seq * l_i), GRPO's 1/|o_i| "
        "(response-coupled, breaks cancellation, docs/objectives.md#length-normalisation); `token_mean`: 1/N_tok, active tokens of the whole "
        "optimizer step (DAPO); `seq_mean_token_sum`: 1/N_seq (REINFORCE/RLOO on sequence log-probs); "
        "`constant`: 1/(N_seq * L) with L = const_length (Dr. GRPO). N_tok, N_seq and L are constants of "
        "the whole step (pass `step=StepNorm` when a step is split into micro-batches). "
        "Default `seq_mean_token_mean`.",
        choices=AGGREGATIONS,
    )
    const_length: int | None = _knob(
        None,
        "L of aggregation=`constant` (Dr. GRPO's generation budget, e.g. max_new_tokens). None: the padded "
        "length of the step (StepNorm.length, else the mask's T). Default None.",
        low=1,
        optional=True,
    )
    # -- transforms ---------------------------------------------------------------------------------
    seq_transform: str = _knob(
        "none",
        "DFPO transform of the per-response weight v_i (everything response-coupled: sequence IS factor and "
        "1/l_i when aggregation is seq_mean_token_mean), under stop-gradient and per group "
        "(arXiv 2604.13088 v1; docs/objectives.md#dfpo-transforms). `min_replace`: v_i <- min_j v_j (Eq. 17); `orth`: "
        "v <- v - (A.v/|A|^2) A (Eq. 18); `none`. Needs whole groups in one call, or precomputed "
        "`seq_weights`. Default `none`.",
        choices=SEQ_TRANSFORMS,
    )
    ar_alpha: float = _knob(
        0.0,
        "Advantage Reweighting: A <- (alpha * pi_old(token) + 1 - alpha) * A, node-local "
        "(arXiv 2505.12929, code default alpha 0.3; docs/objectives.md#advantage-reweighting-and-lopti). 0 disables. Default 0.0.",
        low=0.0,
        high=1.0,
    )
    lopti_eta: float = _knob(
        0.0,
        "Lopti: two update stages per batch split by pi_old(token) < |eta|; eta > 0 updates the "
        "low-probability tokens first, eta < 0 the others first (arXiv 2505.12929, default 0.5). "
        "See `Objective.stages`. 0 disables. Default 0.0.",
        low=-1.0,
        high=1.0,
    )
    # -- regularisers -------------------------------------------------------------------------------
    kl_coef: float = _knob(
        0.0,
        "beta of the KL-to-reference term added to the loss (GRPO uses 0.04 in "
        "arXiv 2402.03300; needs ref_logprobs). Default 0.0.",
        low=0.0,
    )
    kl_estimator: str = _knob(
        "k3",
        "KL estimator on sampled tokens (Schulman, joschu.net/blog/kl-approx): "
        "`k1` log(pi/ref), `k2` (log(pi/ref))^2/2, `k3` ref/pi - log(ref/pi) - 1 "
        "(GRPO's). Default `k3`.",
        choices=KL_ESTIMATORS,
    )
    entropy_coef: float = _knob(
        0.0, "Weight of the entropy bonus (subtracted from the loss; needs `entropies`). Default 0.0."
    )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ObjectiveConfig))


def knob_doc(name: str) -> str:
    return _fields()[name].metadata["doc"]


def _fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(ObjectiveConfig)}


def make_config(
    base: dict[str, Any], overrides: dict[str, Any], *, preset: str = "objective"
) -> ObjectiveConfig:
    """Build and validate a config from preset values plus user overrides; ValueError names the bad knob."""
    unknown = sorted(set(overrides) - set(KNOB_NAMES))
    if unknown:
        raise ValueError(
            f"unknown knob(s) {', '.join(map(repr, unknown))} for objective {preset!r}; "
            f"valid knobs: {', '.join(KNOB_NAMES)}"
        )
    values = {**base, **overrides}
    fields = _fields()
    for name, value in values.items():
        values[name] = _check_knob(name, value, fields[name].metadata, preset)
    cfg = ObjectiveConfig(**values)
    _check_combination(cfg, preset)
    return cfg


def _check_knob(name: str, value: Any, meta: Mapping[str, Any], preset: str) -> Any:
    where = f"objective {preset!r} knob {name!r}"
    if value is None:
        if meta["optional"]:
            return None
        raise ValueError(f"{where}: must not be None")
    if meta["choices"] is not None:
        if value not in meta["choices"]:
            raise ValueError(f"{where}: {value!r} is not one of {', '.join(meta['choices'])}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{where}: must be finite, got {value!r}")
    low, high = meta["low"], meta["high"]
    if low is not None and (value < low or (meta["low_open"] and value == low)):
        raise ValueError(f"{where}: must be {'>' if meta['low_open'] else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{where}: must be <= {high}, got {value!r}")
    if name == "const_length":
        if int(value) != value:
            raise ValueError(f"{where}: must be an integer token count, got {value!r}")
        return int(value)
    return float(value)


def _check_combination(cfg: ObjectiveConfig, preset: str) -> None:
    if cfg.is_max <= cfg.is_min:
        raise ValueError(f"objective {preset!r}: is_max ({cfg.is_max}) must exceed is_min ({cfg.is_min})")
    if cfg.behaviour_high <= cfg.behaviour_low:
        raise ValueError(
            f"objective {preset!r}: behaviour_high ({cfg.behaviour_high}) must exceed behaviour_low "
            f"({cfg.behaviour_low})"
        )
    if cfg.behaviour_correction != "none" and cfg.ratio == "geo_mean":
        raise ValueError(
            f"objective {preset!r}: behaviour_correction={cfg.behaviour_correction!r} is not defined for "
            "ratio='geo_mean' (GMPO's geometric mean would average a token's coefficient over its response); "
            "use ratio='token', 'truncated', 'sequence' or 'none'"
        )
    if cfg.gate == "dual" and cfg.ratio == "geo_mean":
        raise ValueError(
            f"objective {preset!r}: gate='dual' is not defined for ratio='geo_mean'; "
            "use gate='ppo' (GMPO's log-space clip), 'symmetric' or 'none'"
        )


# A D1/D2 residual at or below this is cancellation up to float rounding (float32 weights leave ~1e-8); above it,
# an objective that claims cancellation has lost it (the trainer's warning, the TgcCancellationBroken alert).
RESIDUAL_TOLERANCE = 1e-4


CREDIT_NORMALISERS = ("step", "trajectory", "turn")
CREDIT_REWARDS = ("trajectory", "per_turn")
CREDIT_FILTERS = ("before_centring", "after_centring")


@dataclass(frozen=True)
class TrajectoryCredit:
    """How a multi-turn trajectory's reward becomes the weights of its model tokens
    (docs/objectives.md#multi-turn-credit). The default is the rule that keeps cancellation across turns: one
    trajectory-level reward, centred within the group and broadcast to every model token, a normaliser that
    is constant over the optimizer step, and every trajectory filter applied before centring.

    normaliser: `step` (a constant of the step: the objective's own aggregation), `trajectory` (a mean over
    each trajectory's model tokens) or `turn` (a mean over each turn's tokens). reward: `trajectory` (one
    reward per trajectory) or `per_turn` (the reward split over turns, each turn's tokens credited with its
    share of it: `A_i / K_i`, a discount to its end). filter: when dropped trajectories (failed bridge,
    deadline, bound hit) leave the centring:
    `before_centring` (`group_advantages(keep=)`) or `after_centring`."""

    normaliser: str = "step"
    reward: str = "trajectory"
    filter: str = "before_centring"

    def __post_init__(self) -> None:
        for name, choices in (
            ("normaliser", CREDIT_NORMALISERS),
            ("reward", CREDIT_REWARDS),
            ("filter", CREDIT_FILTERS),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"TrajectoryCredit.{name}: {value!r} is not one of {', '.join(choices)}")

    def reasons(self) -> list[str]:
        """Why this credit rule breaks cancellation across turns (empty: it keeps it)."""
        out = []
        if self.normaliser != "step":
            scope = "trajectory's model tokens" if self.normaliser == "trajectory" else "turn's tokens"
            out.append(
                f"credit normaliser={self.normaliser!r} divides each copy by the length of its {scope}, so "
                "copies of a shared node in trajectories (or turns) of different lengths get different "
                "coefficients; use normaliser='step' (a constant of the whole step)"
            )
        if self.reward == "per_turn":
            out.append(
                "credit reward='per_turn' splits a trajectory's reward over its turns (a share per turn, e.g. "
                "A_i / K_i or a discount to the trajectory's end), so a copy's weight depends on how many turns "
                "its trajectory took and where they end, which copies of one shared node do not share: they "
                "no longer sum to 0; use reward='trajectory'"
            )
        if self.filter == "after_centring":
            out.append(
                "credit filter='after_centring' drops trajectories (failed bridge, deadline) after their group "
                "was centred, so the copies left on a group-common node sum to -(the dropped advantages); "
                "filter before centring (group_advantages(keep=))"
            )
        return out


def cancellation_verdict(
    cfg: ObjectiveConfig, credit: TrajectoryCredit | None = None
) -> tuple[bool, list[str]]:
    """Whether the policy-gradient weights cancel on group-common nodes for *any* ratio
    (docs/objectives.md#knobs-and-the-cancellation-verdict); `credit`: the multi-turn credit rule, for
    trajectories whose loss mask has holes (docs/objectives.md#multi-turn-credit).

    Returns (preserves, reasons it does not). KL/entropy terms are node-local regularisers that are not
    meant to cancel (docs/objectives.md#kl-and-entropy-terms); they are left out of the verdict and of the diagnostics' weights.
    """
    reasons = [] if credit is None else credit.reasons()
    if cfg.adv_scale == "batch_whiten":
        reasons.append(
            "adv_scale='batch_whiten' shifts every advantage by the batch mean, so group sums are no longer 0"
        )
    if cfg.gate in ("ppo", "dual"):
        reasons.append(
            f"gate={cfg.gate!r} switches off one sign class of copies when the ratio leaves the "
            "band; use gate='symmetric' or 'none'"
        )
    if cfg.seq_transform == "none":
        if cfg.aggregation == "seq_mean_token_mean":
            reasons.append(
                "aggregation='seq_mean_token_mean' weights each copy by 1/l_i of its response "
                "(so copies in responses of different lengths differ); use token_mean/constant/seq_mean_token_sum or a "
                "seq_transform"
            )
        if cfg.ratio in ("sequence", "geo_mean"):
            reasons.append(
                f"ratio={cfg.ratio!r} multiplies a copy by its response's sequence ratio "
                "(different for copies in different responses); add seq_transform='min_replace' or 'orth'"
            )
    if cfg.behaviour_correction not in ("none", *TOKEN_CORRECTIONS):
        reasons.append(
            f"behaviour_correction={cfg.behaviour_correction!r} multiplies a copy by a coefficient of its "
            "whole response (different for copies in different responses); use 'token_tis' or 'token_mask'"
        )
    return (not reasons, reasons)


def cancellation_condition(cfg: ObjectiveConfig) -> str | None:
    """The condition on the batch under which `cancellation_verdict`'s True holds, or None where it holds for
    any batch: a token-level behaviour correction cancels only when its coefficient is equal across copies."""
    return BEHAVIOUR_CONDITION if cfg.behaviour_correction in TOKEN_CORRECTIONS else None


def describe_knobs() -> str:
    """Every knob with its default and documentation, one paragraph each."""
    lines = []
    for f in dataclasses.fields(ObjectiveConfig):
        lines.append(f"{f.name} (default {f.default!r}): {f.metadata['doc']}")
    return "\n".join(lines)
