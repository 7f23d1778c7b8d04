"""Pooling the per-step diagnostics of several parts of one optimizer step (micro-batches, ranks).

`cancellation_diagnostics` describes the responses it was given. A learner that splits a step into
micro-batches (whole groups each) and ranks gets one dict per part; these rules combine them into the
step's values (docs/diagnostics.md#pooling-over-micro-batches-and-ranks):

- counts add up (`diag/d1_groups_measured`, `diag/d2_nodes`, `diag/d7_*_tokens`, `diag/d7_*_rows`);
- maxima take the largest value (`*_max`);
- every other statistic is a weighted mean, weighted by what it averages: D1 by the groups it measured,
  D2's node ratios by the shared nodes, D7's position-class entropies by the positions they cover, the
  common-prefix clip fractions of D10 by the groups that have a common prefix, everything else by the part's
  groups.

A part whose weight for a statistic is 0 holds no value of it (rlcore reports such undefined statistics as 0
next to their count), so it is left out: it neither pulls a mean towards 0 nor sets a maximum.
`pool_diagnostics` applies the rules to dicts held in one process; a learner whose reducer spans ranks feeds
`pooling_terms` of each part into its own sum / weighted-mean / max accumulators, which compose the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Rule = Literal["sum", "mean", "max"]

_MEASURED = "diag/d1_groups_measured"
# statistic -> the count it averages over (a weighted mean; a maximum is defined where the count is > 0)
_WEIGHT_KEYS = {
    "diag/d1_gcpr": _MEASURED,
    "diag/d1_gcpr_max": _MEASURED,
    "diag/d2_residual": "diag/d2_nodes",
    "diag/d2_credit_frac": "diag/d2_nodes",
    "diag/d2_node_size_mean": "diag/d2_nodes",
    "diag/d7_entropy_common": "diag/d7_common_tokens",
    "diag/d7_entropy_divergent": "diag/d7_divergent_rows",
    "diag/d7_entropy_shared": "diag/d7_shared_tokens",
    "diag/d7_entropy_fork": "diag/d7_fork_rows",
}
COUNT_KEYS = tuple(dict.fromkeys(_WEIGHT_KEYS.values()))  # the counts, which add up
# averaged over the groups that have a group-common prefix
_PREFIX_GROUP_KEYS = ("diag/d10_clipfrac_common_pos", "diag/d10_clipfrac_common_neg")


@dataclass(frozen=True)
class PoolTerm:
    """One statistic of one part: how it pools (`rule`), its value, and its weight (the count a mean averages
    over; for a maximum, > 0 iff the part defines it; 1 for a count)."""

    key: str
    rule: Rule
    value: float
    weight: float


def pooling_terms(diag: Mapping[str, float], groups: float = 1.0) -> list[PoolTerm]:
    """The pooling rule of every statistic in one part's diagnostics.

    groups: the number of groups in the part, the weight of statistics averaged over groups (1.0 when every
    part weighs the same, e.g. to ask which statistics a single step defines).
    """
    terms = []
    for key, value in diag.items():
        if key in COUNT_KEYS:
            terms.append(PoolTerm(key, "sum", float(value), 1.0))
            continue
        if key in _WEIGHT_KEYS:
            weight = float(diag.get(_WEIGHT_KEYS[key], 0.0))
        elif key in _PREFIX_GROUP_KEYS:
            weight = groups * float(diag.get("diag/d1_groups_with_prefix_frac", 0.0))
        elif key.endswith("_max"):
            weight = 1.0
        else:
            weight = float(groups)
        terms.append(PoolTerm(key, "max" if key.endswith("_max") else "mean", float(value), weight))
    return terms


def defined_diagnostics(diag: Mapping[str, float]) -> dict[str, float]:
    """The statistics one part defines (weight > 0), with their values unchanged."""
    return {t.key: t.value for t in pooling_terms(diag) if t.weight > 0}


def pool_diagnostics(
    parts: Iterable[Mapping[str, float] | tuple[Mapping[str, float], float]],
) -> dict[str, float]:
    """The diagnostics of a whole optimizer step from those of its parts.

    parts: each part's `cancellation_diagnostics` dict, or (dict, number of groups in the part); a bare dict
    counts as one group. A statistic no part defines is absent from the result.
    """
    sums: dict[str, float] = {}
    means: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    for part in parts:
        diag, groups = part if isinstance(part, tuple) else (part, 1.0)
        for t in pooling_terms(diag, groups):
            if t.rule == "sum":
                sums[t.key] = sums.get(t.key, 0.0) + t.value
            elif t.weight <= 0 or not math.isfinite(t.value):  # undefined in this part
                continue
            elif t.rule == "max":
                peaks[t.key] = max(peaks.get(t.key, t.value), t.value)
            else:
                acc = means.setdefault(t.key, [0.0, 0.0])
                acc[0] += t.value * t.weight
                acc[1] += t.weight
    return {**sums, **{k: num / den for k, (num, den) in means.items()}, **peaks}
