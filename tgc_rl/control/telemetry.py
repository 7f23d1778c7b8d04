"""Prometheus metrics of the control plane (`GET /metrics`), all prefixed `tgc_`.

Counters count what this process did; the job gauges are read from the database at scrape time, so
they are right after a restart and the same on every replica.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tgc_rl.control.states import JobState
from tgc_rl.control.store import JobStore

log = logging.getLogger(__name__)

_LABEL_SAFE = re.compile(r"[^a-zA-Z0-9_:./-]")
# A client chooses the method token (any RFC 9110 token is valid HTTP): one label value per method the
# API can answer and "other" for the rest, so a client cannot grow the request histogram's series.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # the route label of a path no route matches (never the raw path)


def method_label(method: str) -> str:
    return method if method in HTTP_METHODS else "other"


class _JobGauges(Collector):
    def __init__(self, store: JobStore):
        self.store = store

    def collect(self) -> Iterator[Metric]:
        try:
            counts = self.store.counts_by_state()
            active = self.store.active_jobs()
        except Exception:  # a scrape must not fail because the database blinked
            log.exception("reading job gauges failed")
            return
        jobs = GaugeMetricFamily("tgc_jobs", "Jobs by state (count).", labels=["state"])
        for state, n in counts.items():
            jobs.add_metric([state.value], n)
        yield jobs
        step = GaugeMetricFamily(
            "tgc_job_step",
            "Last step reported by each active job (steps).",
            labels=["job_id", "tenant", "name"],
        )
        progress = GaugeMetricFamily(
            "tgc_job_progress_ratio",
            "Reported step / spec.steps of each active job.",
            labels=["job_id", "tenant", "name"],
        )
        train = GaugeMetricFamily(
            "tgc_job_train_metric",
            "Latest per-step training metric reported by each active job (unit: the metric's own).",
            labels=["job_id", "tenant", "metric"],
        )
        age = GaugeMetricFamily(
            "tgc_job_report_age_seconds",
            "Seconds since each active job last reported.",
            labels=["job_id", "tenant"],
        )
        now = time.time()
        for job in active:
            if job.step is not None:
                step.add_metric([job.id, job.tenant, job.name], job.step)
                total = int(job.spec.get("steps", 0)) or 1
                progress.add_metric([job.id, job.tenant, job.name], job.step / total)
            for name, value in job.latest_metrics.items():
                if value is not None:
                    train.add_metric([job.id, job.tenant, _LABEL_SAFE.sub("_", name)], value)
            if job.reported_at is not None:
                age.add_metric([job.id, job.tenant], now - job.reported_at)
        yield from (step, progress, train, age)


class Telemetry:
    def __init__(self, store: JobStore):
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_seconds = Histogram(
            "tgc_http_request_duration_seconds",
            "Latency of REST requests (seconds), by route template.",
            ["method", "route", "status"],
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.submissions = Counter(
            "tgc_job_submissions", "Jobs accepted by POST /v1/jobs.", ["tenant"], registry=r
        )
        self.rejections = Counter(
            "tgc_job_rejections", "Job submissions refused (invalid spec or policy).", ["reason"], registry=r
        )
        self.finished = Counter(
            "tgc_jobs_finished", "Jobs that reached a terminal state.", ["state"], registry=r
        )
        self.failures = Counter("tgc_job_failures", "Jobs that ended failed.", registry=r)
        self.hard_stops = Counter(
            "tgc_job_hard_stops",
            "Cancelled jobs whose trainer missed the grace period and was stopped hard.",
            registry=r,
        )
        self.trainer_events = Counter(
            "tgc_trainer_events",
            "Events reported by trainers and stored (duplicates excluded).",
            ["type"],
            registry=r,
        )
        self.registry.register(_JobGauges(store))

    def job_finished(self, state: JobState, hard: bool = False) -> None:
        self.finished.labels(state.value).inc()
        if state == JobState.FAILED:
            self.failures.inc()
        if hard:
            self.hard_stops.inc()


class RequestMetricsMiddleware:
    """ASGI middleware timing each request by its route template (not its raw path: bounded labels)."""

    def __init__(self, app, telemetry: Telemetry):
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            self.telemetry.request_seconds.labels(
                method_label(scope["method"]), template, str(status)
            ).observe(time.perf_counter() - start)
