"""Prometheus metrics of the code sandbox (once per process, on the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

SANDBOX_RUNS = Counter(
    "tgc_sandbox_runs",
    "Programs run in the code sandbox (runs), by status: finished, timeout, output_limit, error.",
    ["status"],
)
SANDBOX_SECONDS = Histogram(
    "tgc_sandbox_run_seconds",
    "Wall time of one sandboxed program run, sandbox setup included (seconds).",
    unit="seconds",
    buckets=LATENCY_BUCKETS,
)
