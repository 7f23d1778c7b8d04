"""Named objectives: each a composition of the orthogonal knobs of `rlcore.config` (torch-free).

Verdicts (does the preset cancel on group-common nodes?) are derived from the knobs by
`config.cancellation_verdict`, not asserted per preset; tests check them numerically (diagnostic D1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlcore.config import ObjectiveConfig, cancellation_verdict, make_config


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    knobs: dict[str, Any] = field(default_factory=dict)


_GRPO = dict(
    adv_baseline="mean",
    adv_scale="group_std",
    ratio="token",
    gate="ppo",
    clip_low=0.2,
    clip_high=0.2,
    aggregation="seq_mean_token_mean",
)
_CP = dict(
    adv_baseline="mean",
    adv_scale="group_std",
    ratio="truncated",
    is_min=0.8,
    is_max=1.28,
    gate="symmetric",
    clip_low=0.2,
    clip_high=0.28,
    aggregation="token_mean",
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "grpo",
            "GRPO (arXiv 2402.03300): (R-mean)/std, token ratio, PPO clip 0.2, 1/|o_i| per response.",
            _GRPO,
        ),
        Preset(
            "dr_grpo",
            "Dr. GRPO (arXiv 2503.20783): R-mean, no std, PPO clip, constant normaliser G*L.",
            {**_GRPO, "adv_scale": "none", "aggregation": "constant"},
        ),
        Preset(
            "dapo",
            "DAPO (arXiv 2503.14476): clip-higher 0.2/0.28, token mean over the step "
            "(dynamic sampling lives in the job spec; overlong shaping via the advantages() bonus hook).",
            {**_GRPO, "clip_high": 0.28, "aggregation": "token_mean"},
        ),
        Preset(
            "gspo",
            "GSPO (arXiv 2507.18071): sequence ratio s_i, sequence clip 3e-4/4e-4, mean over responses.",
            {**_GRPO, "ratio": "sequence", "clip_low": 3e-4, "clip_high": 4e-4},
        ),
        Preset(
            "gmpo",
            "GMPO (arXiv 2507.20673): geometric mean of token ratios clipped in log space (+-0.4).",
            {**_GRPO, "ratio": "geo_mean", "clip_low": 0.4, "clip_high": 0.4},
        ),
        Preset(
            "cispo",
            "CISPO (arXiv 2506.13585): sg(min(r, 5)) * A * log pi, no gate, token mean.",
            {
                **_GRPO,
                "ratio": "truncated",
                "is_min": 0.0,
                "is_max": 5.0,
                "gate": "none",
                "aggregation": "token_mean",
            },
        ),
        Preset(
            "rloo",
            "RLOO (arXiv 2402.14740): leave-one-out baseline, REINFORCE on sequence log-probs "
            "(token ratio as a node-local IS weight, no gate), mean over responses.",
            {
                **_GRPO,
                "adv_baseline": "loo",
                "adv_scale": "none",
                "gate": "none",
                "aggregation": "seq_mean_token_sum",
            },
        ),
        Preset(
            "reinforce_pp_baseline",
            "REINFORCE++-baseline (arXiv 2501.03262): group mean, then scale-only "
            "batch whitening (no mean shift, so group sums stay 0), PPO clip, token mean.",
            {**_GRPO, "adv_scale": "batch_std", "aggregation": "token_mean"},
        ),
        Preset(
            "dfpo_min",
            "DFPO Min-Replace (arXiv 2604.13088 v1 Eq. 17) on the IS factor: every response of a "
            "group weighted by sg(min_j s_j), constant length normaliser, no clip. Min-Replace on 1/l_i "
            "over-corrects (docs/objectives.md#dfpo-transforms), so the length normaliser is kept constant.",
            {
                **_GRPO,
                "ratio": "sequence",
                "gate": "none",
                "aggregation": "constant",
                "seq_transform": "min_replace",
            },
        ),
        Preset(
            "dfpo_orth",
            "DFPO Adv-Orthogonal (arXiv 2604.13088 v1 Eq. 18) on GSPO's per-response weight "
            "s_i/l_i, no clip: cancels on group-common prefixes, not on partial ones.",
            {**_GRPO, "ratio": "sequence", "gate": "none", "seq_transform": "orth"},
        ),
        Preset(
            "grpo_ar",
            "GRPO + Advantage Reweighting alpha=0.3 (arXiv 2505.12929).",
            {**_GRPO, "ar_alpha": 0.3},
        ),
        Preset(
            "grpo_lopti",
            "GRPO + Lopti eta=0.5 (arXiv 2505.12929): low-probability tokens updated first.",
            {**_GRPO, "lopti_eta": 0.5},
        ),
        Preset(
            "cp_grpo",
            "CP-GRPO (docs/objectives.md#cp-grpo): (R-mean)/std, stop-gradient IS weight clip(r, .8, "
            "1.28), symmetric trust-region gate, token mean over the step: cancels on every shared node.",
            _CP,
        ),
        Preset(
            "cp_grpo_ar",
            "CP-GRPO + Advantage Reweighting alpha=0.3 (node-local, keeps cancellation).",
            {**_CP, "ar_alpha": 0.3},
        ),
        Preset(
            "cp_grpo_lopti",
            "CP-GRPO + Lopti eta=0.5 (node-local stage split, keeps cancellation).",
            {**_CP, "lopti_eta": 0.5},
        ),
        Preset(
            "ibpo_cp",
            "IBPO compare-and-correct shaping (arXiv 2605.16302) on CP-GRPO: R' = R + 0.6 * phi before "
            "group centring, phi from rlcore.ibpo (the trainer's `ibpo` section generates it; docs/ibpo.md). "
            "Keeps cancellation; so does its symmetric edit mask, the naive one does not (rlcore.ibpo.verdict).",
            {**_CP, "bonus_coef": 0.6},
        ),
    ]
}


def list_objectives() -> list[str]:
    """Names accepted by `get_objective` (and by the job spec's `objective.name`)."""
    return list(PRESETS)


def resolve(name: str, overrides: dict[str, Any] | None = None) -> ObjectiveConfig:
    """The validated config of preset `name` with `overrides`; torch-free (the control plane uses it)."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown objective {name!r}; choose one of: {', '.join(PRESETS)}")
    return make_config(PRESETS[name].knobs, dict(overrides or {}), preset=name)


def preserves_cancellation(name: str, overrides: dict[str, Any] | None = None) -> bool:
    return cancellation_verdict(resolve(name, overrides))[0]
