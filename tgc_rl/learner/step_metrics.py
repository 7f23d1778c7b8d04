"""Per-step metrics gathered over micro-batches and ranks, reduced with one all-reduce.

Four kinds: sums (the step loss, counts: each rank holds a part), weighted means (entropy, mismatch,
objective metrics and diagnostics of each micro-batch, weighted by its tokens or groups), peaks (maxima)
and timings (summed on each rank, then the slowest rank's: it sets the pace).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.distributed as dist
from torch import Tensor


class StepMetrics:
    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weighted: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.peaks: dict[str, float] = {}
        self.times: dict[str, float] = defaultdict(float)

    def add_sum(self, name: str, value: float) -> None:
        self.sums[name] += float(value)

    def add_mean(self, name: str, value: float, weight: float) -> None:
        value = float(value)
        if math.isfinite(value) and weight > 0:  # undefined metrics (e.g. a correlation of constants) skip
            acc = self.weighted[name]
            acc[0] += value * weight
            acc[1] += weight

    def add_means(self, values: dict[str, float], weight: float, prefix: str = "") -> None:
        for k, v in values.items():
            if isinstance(v, int | float) or (isinstance(v, Tensor) and v.numel() == 1):
                self.add_mean(prefix + k, float(v), weight)

    def add_peak(self, name: str, value: float) -> None:
        if math.isfinite(value):
            self.peaks[name] = max(self.peaks.get(name, -math.inf), float(value))

    def add_time(self, name: str, seconds: float) -> None:
        self.times[name] += float(seconds)

    def reduce(self, device: torch.device) -> dict[str, float]:
        """Collective over the default group: the step's metrics, identical on every rank."""
        peaks = {**self.peaks, **self.times}  # both reduce with MAX over ranks
        keys: tuple[list[str], ...] = (sorted(self.sums), sorted(self.weighted), sorted(peaks))
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        if distributed:  # ranks may have seen different keys (e.g. one ran only padding passes)
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, keys)
            keys = tuple(sorted(set().union(*(g[i] for g in gathered))) for i in range(3))
        sum_keys, mean_keys, peak_keys = keys
        zero = [0.0, 0.0]
        flat = torch.tensor(
            [self.sums.get(k, 0.0) for k in sum_keys]
            + [self.weighted.get(k, zero)[0] for k in mean_keys]
            + [self.weighted.get(k, zero)[1] for k in mean_keys],
            dtype=torch.float64,
            device=device,
        )
        top = torch.tensor([peaks.get(k, -math.inf) for k in peak_keys], dtype=torch.float64, device=device)
        if distributed:
            dist.all_reduce(flat)
            if peak_keys:
                dist.all_reduce(top, op=dist.ReduceOp.MAX)
        flat_l, top_l = flat.tolist(), top.tolist()
        n, m = len(sum_keys), len(mean_keys)
        out = dict(zip(sum_keys, flat_l[:n], strict=True))
        for i, k in enumerate(mean_keys):
            if flat_l[n + m + i] > 0:
                out[k] = flat_l[n + i] / flat_l[n + m + i]
        out.update((k, v) for k, v in zip(peak_keys, top_l, strict=True) if math.isfinite(v))
        return out
