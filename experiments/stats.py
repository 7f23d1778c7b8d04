"""Summary statistics across seeds: mean ± standard error, differences and an exact permutation test.

With 3-8 seeds per condition, distributional assumptions are hard to check, so the test of a difference
between two conditions is an exact two-sided permutation test of the difference of means (all ways to
relabel the pooled seeds; random relabelings when there are more than `MAX_EXACT`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

MAX_EXACT = 20_000


@dataclass(frozen=True)
class Summary:
    mean: float
    se: float
    n: int

    def fmt(self, digits: int = 3) -> str:
        if self.n == 0 or not math.isfinite(self.mean):
            return "n/a"
        if self.n == 1 or not math.isfinite(self.se):
            return f"{self.mean:.{digits}g}"
        return f"{_num(self.mean, digits)} ± {_num(self.se, 2)}"


def _num(x: float, digits: int) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.{max(digits - 1, 1)}e}"
    return f"{x:.{digits}g}"  # significant digits: a small s.e. must not print as 0


def finite(values: Sequence[float]) -> np.ndarray:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    return arr[np.isfinite(arr)]


def summarize(values: Sequence[float]) -> Summary:
    """Mean and standard error (sample std with ddof=1 over sqrt(n)) of the finite values."""
    arr = finite(values)
    if arr.size == 0:
        return Summary(float("nan"), float("nan"), 0)
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else float("nan")
    return Summary(float(arr.mean()), se, int(arr.size))


@dataclass(frozen=True)
class Comparison:
    diff: float  # mean(a) - mean(b)
    se: float  # sqrt(se_a^2 + se_b^2)
    p_value: float  # two-sided permutation test of the difference of means
    n_a: int
    n_b: int

    def fmt(self) -> str:
        if self.n_a == 0 or self.n_b == 0:
            return "n/a"
        if self.n_a == 1 or self.n_b == 1:  # no spread on that side: a difference, not a test
            return f"{_num(self.diff, 3)} (one run)"
        return f"{_num(self.diff, 3)} ± {_num(self.se, 2)} (p={self.p_value:.2g})"


def permutation_p(a: Sequence[float], b: Sequence[float], seed: int = 0) -> float:
    """Two-sided p-value of mean(a) - mean(b) under exchangeability of the pooled values."""
    x, y = finite(a), finite(b)
    if x.size == 0 or y.size == 0:
        return float("nan")
    pooled = np.concatenate([x, y])
    observed = abs(x.mean() - y.mean())
    n, k = pooled.size, x.size
    total = pooled.sum()
    tol = 1e-12 * max(1.0, abs(observed))
    if math.comb(n, k) <= MAX_EXACT:
        splits = itertools.combinations(range(n), k)
        stats = np.array(
            [abs(pooled[list(s)].sum() / k - (total - pooled[list(s)].sum()) / (n - k)) for s in splits]
        )
        return float((stats >= observed - tol).mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(MAX_EXACT):
        idx = rng.permutation(n)[:k]
        s = pooled[idx].sum()
        hits += abs(s / k - (total - s) / (n - k)) >= observed - tol
    return (hits + 1) / (MAX_EXACT + 1)


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest p-value `permutation_p` can give samples of these sizes (the observed split alone, or
    with its mirror image when the sizes are equal): below alpha or no difference can be significant."""
    splits = math.comb(n_a + n_b, n_a)
    if splits > MAX_EXACT:
        return 1 / (MAX_EXACT + 1)
    return (2 if n_a == n_b else 1) / splits


def compare(a: Sequence[float], b: Sequence[float]) -> Comparison:
    sa, sb = summarize(a), summarize(b)
    se = math.sqrt(
        (sa.se if math.isfinite(sa.se) else 0.0) ** 2 + (sb.se if math.isfinite(sb.se) else 0.0) ** 2
    )
    return Comparison(sa.mean - sb.mean, se, permutation_p(a, b), sa.n, sb.n)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (same order; NaN stays NaN and is not counted):
    a claim is significant at alpha when its adjusted p is below alpha, with the family-wise error <= alpha."""
    finite_at = sorted((p, i) for i, p in enumerate(p_values) if math.isfinite(p))
    m = len(finite_at)
    out = [float("nan")] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(finite_at):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def pooled_sd(groups: Sequence[Sequence[float]]) -> float:
    """The within-group standard deviation pooled over groups (each about its own mean): the seed-to-seed noise
    of a measure when the groups are arms that may differ. NaN when no group has two finite values."""
    arrays = [finite(g) for g in groups]
    dof = sum(a.size - 1 for a in arrays if a.size > 1)
    if dof == 0:
        return float("nan")
    return math.sqrt(sum(float(((a - a.mean()) ** 2).sum()) for a in arrays if a.size > 1) / dof)


def detectable_difference(sd: float, n_a: int, n_b: int, alpha: float, power: float = 0.8) -> float:
    """The smallest true difference of means that a two-sided test at level `alpha` detects with probability
    `power`, for samples of these sizes with standard deviation `sd` (normal approximation). A "no effect"
    verdict rules out effects about this large, not smaller ones."""
    if n_a < 1 or n_b < 1 or not math.isfinite(sd):
        return float("nan")
    z = NormalDist().inv_cdf
    return (z(1 - alpha / 2) + z(power)) * sd * math.sqrt(1 / n_a + 1 / n_b)
