"""Summary statistics across seeds: mean ± standard error, differences and an exact permutation test.

With 3-8 seeds per condition, distributional assumptions are hard to check, so the test of a difference
between two conditions is an exact two-sided permutation test of the difference of means (all ways to
relabel the pooled seeds; random relabelings when there are more than `MAX_EXACT`). The interval given with
a difference is Welch's t interval, and the smallest difference a design can detect is t-based too: with a
handful of seeds the normal approximation understates both.
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
    df: float = math.nan  # Welch-Satterthwaite degrees of freedom of `se` (NaN: no spread on either side)

    def fmt(self) -> str:
        if self.n_a == 0 or self.n_b == 0:
            return "n/a"
        if self.n_a == 1 or self.n_b == 1:  # no spread on that side: a difference, not a test
            return f"{_num(self.diff, 3)} (one run)"
        return f"{_num(self.diff, 3)} ± {_num(self.se, 2)} (p={self.p_value:.2g})"

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """Welch's t interval of the difference (NaN without two runs a side; the difference itself when
        neither side varies)."""
        if self.n_a < 2 or self.n_b < 2:
            return math.nan, math.nan
        if not math.isfinite(self.df):
            return self.diff, self.diff
        half = t_quantile(0.5 + level / 2, self.df) * self.se
        return self.diff - half, self.diff + half

    def fmt_ci(self, level: float = 0.95) -> str:
        """The difference with its interval: `+0.06 (95% CI -0.14 to +0.25)`."""
        low, high = self.ci(level)
        if not math.isfinite(low):
            return self.fmt()
        return f"{_signed(self.diff)} ({level:.0%} CI {_signed(low)} to {_signed(high)})"

    def fmt_effect(self) -> str:
        """The difference with its interval and raw p, as the report prints every test; the plain difference
        where a side has one run."""
        return f"{self.fmt_ci()}, p={self.p_value:.2g}" if self.n_a > 1 and self.n_b > 1 else self.fmt()


def _signed(x: float) -> str:
    return ("+" if x > 0 else "") + _num(x, 2)


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
    va = sa.se**2 if math.isfinite(sa.se) else 0.0
    vb = sb.se**2 if math.isfinite(sb.se) else 0.0
    # Welch-Satterthwaite: the degrees of freedom of a difference whose two sides may spread differently
    denom = (va**2 / (sa.n - 1) if sa.n > 1 else 0.0) + (vb**2 / (sb.n - 1) if sb.n > 1 else 0.0)
    df = (va + vb) ** 2 / denom if denom > 0 else math.nan
    return Comparison(sa.mean - sb.mean, math.sqrt(va + vb), permutation_p(a, b), sa.n, sb.n, df)


def t_cdf(x: float, df: float) -> float:
    """Student's t distribution function. With t = sqrt(df) tan(u) the density becomes proportional to
    cos(u)^(df - 1) on (-pi/2, pi/2), a bounded integral that Simpson's rule gets to ~1e-9."""
    if not math.isfinite(x):
        return 0.0 if x < 0 else 1.0
    if df > 1e6:
        return NormalDist().cdf(x)
    theta = math.atan(abs(x) / math.sqrt(df))
    u = np.linspace(0.0, theta, 2 * 1000 + 1)
    f = np.cos(u) ** (df - 1)
    integral = (theta / 6000) * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    half = min(0.5, scale * integral)
    return 0.5 + half if x >= 0 else 0.5 - half


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with `df` (> 0, not necessarily whole) degrees of freedom, by bisection
    of `t_cdf` (no statistics library in the project's dependencies has it)."""
    if not 0 < q < 1 or not df > 0:
        return math.nan
    if q < 0.5:
        return -t_quantile(1 - q, df)
    if df > 1e6:
        return NormalDist().inv_cdf(q)
    low, high = 0.0, math.pi / 2  # in u = atan(t / sqrt(df)): a bounded search
    for _ in range(60):
        mid = (low + high) / 2
        if t_cdf(math.sqrt(df) * math.tan(mid), df) < q:
            low = mid
        else:
            high = mid
    return math.sqrt(df) * math.tan((low + high) / 2)


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
    """The true difference of means that a two-sided test at level `alpha` detects with probability `power`,
    for samples of these sizes with standard deviation `sd`: t quantiles on n_a + n_b - 2 degrees of freedom
    (with a few seeds a side the normal approximation promises about a third too much). A non-significant
    result with this power is not evidence that a smaller, or even this large, effect is absent: one time in
    five it misses an effect of exactly this size."""
    df = n_a + n_b - 2
    if n_a < 1 or n_b < 1 or df < 1 or not math.isfinite(sd):
        return float("nan")
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * sd * math.sqrt(1 / n_a + 1 / n_b)


def direction(diff: float, expected: int, by: str = "the paper") -> str:
    """Which way a difference points against a prediction (+1: a > b predicted, -1: a < b, 0: none)."""
    if expected == 0 or not math.isfinite(diff):
        return f"{_signed(diff)}, no predicted direction"
    if diff == 0:
        return "no difference at all"
    return f"{by}'s direction" if np.sign(diff) == expected else f"against {by}'s direction"
