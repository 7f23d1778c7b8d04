"""Which of rlcore's per-step diagnostics are defined in an optimizer step, and their means over steps.

rlcore reports an undefined statistic as 0 next to a count (e.g. D1 when no group has a common prefix with a
non-zero advantage); its pooling rules say which count each statistic rests on (`rlcore.pooling`). Averaging
those zeros into a run's mean would dilute it, so studies keep only the defined ones.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rlcore.config import RESIDUAL_TOLERANCE
from rlcore.pooling import defined_diagnostics as defined

EXACT = RESIDUAL_TOLERANCE  # a D1/D2 residual at or below this is cancellation up to floating-point rounding

__all__ = ["defined", "mean_defined"]


def mean_defined(diags: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per key, the mean over the optimizer steps where it is defined (NaN where it never is); every step
    weighs the same, as a time average over training should."""
    diags = list(diags)
    keys = {k for d in diags for k in d}
    return {
        k: float(np.mean(vals)) if (vals := [d[k] for d in diags if k in d]) else float("nan")
        for k in sorted(keys)
    }
