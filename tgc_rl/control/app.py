"""The FastAPI application: wiring of store, auth, scheduler, telemetry and routes.

`create_app(settings)` migrates the database, and (unless `settings.scheduler` is off or there is no
Ray) runs the scheduler thread for the app's lifetime.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tgc_rl.config import JobSpec
from tgc_rl.control import api_datasets, api_internal, api_jobs
from tgc_rl.control.auth import metrics_reader
from tgc_rl.control.console import install_console
from tgc_rl.control.datasets import DatasetStore, upload_policy
from tgc_rl.control.db import make_engine
from tgc_rl.control.docs_ui import install_docs_ui
from tgc_rl.control.errors import error_response, install_error_handlers, refuse_unknown_query
from tgc_rl.control.limits import BodyReadTimeout, BodySizeLimit, RateLimiter, StreamSlots
from tgc_rl.control.migrations import migrate
from tgc_rl.control.openapi import install_openapi
from tgc_rl.control.scheduler import RetentionSweeper, Scheduler
from tgc_rl.control.settings import ControlSettings
from tgc_rl.control.store import JobRow, JobStore, QueueFull
from tgc_rl.control.telemetry import RequestMetricsMiddleware, Telemetry
from tgc_rl.control.tokens import TokenStore

log = logging.getLogger(__name__)

API_DESCRIPTION = """
Runs whole RL post-training jobs (GRPO family) on Ray and keeps their records.

Authenticate with `Authorization: Bearer <token>`; an operator creates tokens with
`tgc token create --tenant NAME`. The job spec (`POST /v1/jobs` body) is the same schema as a YAML
job file (`tgc schema` prints it).
"""


@dataclass
class ControlPlane:
    """Everything a request handler needs (on `app.state.cp`)."""

    settings: ControlSettings
    store: JobStore
    token_store: TokenStore
    telemetry: Telemetry
    scheduler: Scheduler | None
    datasets: DatasetStore | None = None
    # Defaults: no limit (create_app passes the configured ones).
    rate_limiter: RateLimiter = field(default_factory=lambda: RateLimiter(0, 1))  # per API token (auth)
    streams: StreamSlots = field(default_factory=lambda: StreamSlots(0))  # open event streams per tenant

    def wake_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.wake()

    def driver_log(self, job: JobRow, attempt: int) -> str | None:
        """The Ray driver's output: live from Ray while it knows the job, else the tail kept at its end."""
        if (
            self.scheduler is not None
            and self.scheduler.ray is not None
            and attempt == job.attempt
            and job.ray_submission_id
            and not job.ray_done
        ):
            try:
                text = self.scheduler.ray.logs(job.ray_submission_id)
                if text is not None:
                    return text
            except Exception as e:
                log.warning("job %s: driver log from Ray failed: %s", job.id, e)
        return self.store.driver_log(job.id, attempt)


def create_app(settings: ControlSettings | None = None) -> FastAPI:
    settings = settings or ControlSettings.from_env()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.database_url)
    applied = migrate(engine)
    if applied:
        log.info("database migrated to version %d", applied[-1])
    store = JobStore(engine, max_queued=settings.max_queued_jobs)
    token_store = TokenStore(engine)
    telemetry = Telemetry(store)
    scheduler = None
    if settings.scheduler and settings.ray_address != "none":
        scheduler = Scheduler(store, token_store, settings, telemetry)
    datasets = DatasetStore(engine, settings.datasets_path, upload_policy(settings))
    cp = ControlPlane(
        settings,
        store,
        token_store,
        telemetry,
        scheduler,
        datasets,
        RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst),
        StreamSlots(settings.max_streams_per_tenant),
    )
    retention = RetentionSweeper(store, settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if scheduler is not None:
            scheduler.start()
        if retention.enabled:
            retention.start()
        try:
            yield
        finally:
            await run_in_threadpool(retention.stop)
            if scheduler is not None:
                await run_in_threadpool(scheduler.stop)
            engine.dispose()

    # docs_url/redoc_url off: FastAPI's pages load their assets from a CDN; install_docs_ui serves local ones.
    app = FastAPI(
        title="tgc-rl control plane",
        version="1",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(refuse_unknown_query)],
    )
    install_openapi(app)
    install_docs_ui(app)
    install_console(app)
    app.state.cp = cp
    install_error_handlers(app)

    @app.exception_handler(QueueFull)  # submit or resume beyond max_queued_jobs
    async def _queue_full(_: Request, e: QueueFull) -> JSONResponse:
        return error_response(429, "too_many_requests", str(e), headers={"Retry-After": "30"})

    app.add_middleware(
        BodySizeLimit, max_bytes=settings.max_body_bytes, paths={"/v1/datasets": settings.max_dataset_bytes}
    )
    app.add_middleware(BodyReadTimeout, timeout_s=settings.client_body_timeout_s)
    app.add_middleware(RequestMetricsMiddleware, telemetry=telemetry)
    app.include_router(api_jobs.router)
    app.include_router(api_datasets.router)
    app.include_router(api_internal.router)

    @app.get("/healthz", tags=["ops"], summary="Liveness: the process answers")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["ops"],
        summary="Readiness: the database and Ray are reachable",
        responses={503: {"description": "Not ready; `checks` says what is down."}},
    )
    def readyz() -> JSONResponse:
        checks: dict[str, str] = {}
        try:
            store.ping()
            checks["db"] = "ok"
        except Exception as e:
            checks["db"] = f"down: {e}"
        if scheduler is None:
            checks["ray"] = "not used (scheduler off)"
        elif scheduler.ray_ready():
            checks["ray"] = "ok"
        else:
            checks["ray"] = f"down: {scheduler.ray_error or 'no answer'}"
        ready = checks["db"] == "ok" and not checks["ray"].startswith("down")
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @app.get(
        "/metrics",
        tags=["ops"],
        summary="Prometheus metrics (the metrics token or an admin token)",
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 401: {"description": "No metrics token."}},
        dependencies=[Depends(metrics_reader)],
    )
    def metrics() -> Response:
        return Response(generate_latest(telemetry.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/schema", tags=["jobs"], summary="The job spec's JSON schema")
    def schema() -> dict:
        return JobSpec.model_json_schema(by_alias=True)

    return app
