"""Prometheus metrics of the reward side, and the step-metric window a `RewardPool` reports.

The Prometheus objects live once per process on the default registry (a `/metrics` endpoint in the
same process shows them); pools and sandboxes label their samples. `StatsWindow` keeps cumulative and
since-last-read counts plus latencies for the trainer's step metrics (`reward/timeouts`, ...).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from tgc_rl.sandbox.metrics import LATENCY_BUCKETS as _LATENCY_BUCKETS

STATUSES = ("ok", "timeout", "error")

VERIFICATIONS = Counter(
    "tgc_reward_verifications",
    "Verifications finished by the reward pool (verifications), by status: ok, timeout, error.",
    ["task", "status"],
)
VERIFY_SECONDS = Histogram(
    "tgc_reward_verification_seconds",
    "Wall time of one verification in a pool worker, dispatch to result (seconds).",
    ["task"],
    unit="seconds",
    buckets=_LATENCY_BUCKETS,
)
WORKER_RESTARTS = Counter(
    "tgc_reward_worker_restarts",
    "Reward workers killed at a deadline or crashed, then replaced (workers).",
    ["task"],
)
QUEUE_DEPTH = Gauge(
    "tgc_reward_queue_depth",
    "Verifications waiting for a free reward worker (verifications).",
    ["task"],
)


@dataclass
class StatsWindow:
    """Counts by status and latencies; `read()` returns cumulative and since-last-read figures."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    _window: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    _latencies: list[float] = field(default_factory=list)
    _restarts: int = 0

    def record(self, status: str, seconds: float) -> None:
        with self._lock:
            self._total[status] += 1
            self._window[status] += 1
            self._latencies.append(seconds)

    def restarted(self) -> None:
        with self._lock:
            self._restarts += 1

    def read(self) -> dict[str, float]:
        with self._lock:
            window, self._window = self._window, dict.fromkeys(STATUSES, 0)
            lat, self._latencies = sorted(self._latencies), []
            total, restarts = dict(self._total), self._restarts
        return {
            "reward/ok": float(window["ok"]),
            "reward/timeouts": float(window["timeout"]),
            "reward/errors": float(window["error"]),
            "reward/ok_total": float(total["ok"]),
            "reward/timeouts_total": float(total["timeout"]),
            "reward/errors_total": float(total["error"]),
            "reward/worker_restarts_total": float(restarts),
            "reward/latency_p50_s": _quantile(lat, 0.50),
            "reward/latency_p99_s": _quantile(lat, 0.99),
        }


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile; 0.0 for an empty window."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, int(q * len(sorted_values) + 0.999999) - 1))
    return sorted_values[rank]
