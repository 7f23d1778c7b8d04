"""Which of rlcore's per-step diagnostics are defined in a given optimizer step.

rlcore reports an undefined statistic as 0 next to a count (e.g. D1 when no group has a common prefix
with a non-zero advantage). Averaging those zeros into a run's mean would dilute it, so studies drop them.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# Defined only when some group has a common prefix and a non-zero advantage (D1 counts them).
MEASURED_KEYS = ("diag/d1_gcpr", "diag/d1_gcpr_max")
# Defined only when some group has a common prefix at all.
PREFIX_KEYS = ("diag/d7_entropy_common", "diag/d10_clipfrac_common_pos", "diag/d10_clipfrac_common_neg")


def defined(diag: dict[str, float]) -> dict[str, float]:
    """The statistics of one optimizer step's diagnostics that are defined."""
    drop = set()
    if diag.get("diag/d1_groups_measured", 1.0) == 0:
        drop.update(MEASURED_KEYS)
    if diag.get("diag/d1_groups_with_prefix_frac", 1.0) == 0:
        drop.update(PREFIX_KEYS)
    return {k: v for k, v in diag.items() if k not in drop}


def mean_defined(diags: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per key, the mean over the steps where it is defined (NaN where it never is)."""
    diags = list(diags)
    keys = {k for d in diags for k in d}
    return {k: float(np.mean(vals)) if (vals := [d[k] for d in diags if k in d]) else float("nan")
            for k in sorted(keys)}
