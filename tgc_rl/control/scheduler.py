"""The scheduler: one background thread that moves jobs through their lifecycle against Ray.

Each tick it
1. reconciles jobs on Ray with what Ray says (the Ray Jobs API is the truth about the driver process;
   after a restart it also reads the trainers' run dirs for events it missed while down),
2. enforces cancels (a trainer that has not stopped within the grace period is stopped hard),
3. admits queued jobs, oldest first, while their tenant is under its concurrent-job quota.

`RetentionSweeper` is its own thread (it runs with or without Ray): it deletes ended jobs past the
retention limits, with their run directories.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import threading
import time
from pathlib import Path

from tgc_rl.bounded_read import LIMITS_ENV
from tgc_rl.config import JobSpec
from tgc_rl.control import progress, tokens
from tgc_rl.control.datasets import data_limits
from tgc_rl.control.ray_cluster import LocalRayCluster
from tgc_rl.control.ray_jobs import RayJobs, RayUnavailable, submission_id
from tgc_rl.control.settings import ControlSettings
from tgc_rl.control.states import TERMINAL, JobState
from tgc_rl.control.store import InvalidTransition, JobRow, JobStore
from tgc_rl.control.telemetry import Telemetry
from tgc_rl.control.tokens import TokenStore
from tgc_rl.run_layout import SPEC_FILE
from tgc_rl.tasks.dataset import DATA_ROOT_ENV, DATASETS_DIR_ENV
from tgc_rl.tasks.grants import GRANTS_ENV

log = logging.getLogger(__name__)
_RUN_DIR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class SchedulerInvariantError(RuntimeError):
    """A state the scheduler's own bookkeeping rules out (a bug, not a job's fault): raised, never skipped the
    way `assert` is under `python -O`."""


class Scheduler:
    def __init__(
        self, store: JobStore, token_store: TokenStore, settings: ControlSettings, telemetry: Telemetry
    ):
        self.store = store
        self.token_store = token_store
        self.settings = settings
        self.telemetry = telemetry
        self.ray: RayJobs | None = None
        self.ray_error: str | None = "not connected yet"
        self.local_cluster: LocalRayCluster | None = None
        if settings.ray_address == "local":
            self.local_cluster = LocalRayCluster(
                settings.data_dir, settings.ray_num_cpus, settings.ray_object_store_bytes
            )
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._reconciled = False
        self._lingering_stopped: set[str] = set()  # submissions stopped after their trainer ended

    # -- thread -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tgc-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """Run a tick now (after a submission or a cancel) instead of at the next period."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._check_local_head()
                if self._connect():
                    self.tick()
            except Exception:
                log.exception("scheduler tick failed; retrying next period")
            self._wake.wait(self.settings.poll_interval_s)
            self._wake.clear()

    def _connect(self) -> bool:
        if self.ray is not None:
            return True
        try:
            if self.local_cluster is not None:
                address, token = self.local_cluster.ensure(), self.local_cluster.token
                ray = RayJobs(address, token)
            else:
                ray = RayJobs(self.settings.ray_address, self.settings.ray_auth_token)
            if not ray.ping():
                raise RuntimeError(f"no Ray Jobs API answers at {address}")
            self.ray, self.ray_error = ray, None
            log.info("connected to the Ray Jobs API at %s", address)
            return True
        except Exception as e:
            self.ray_error = str(e)
            log.warning("Ray is not reachable yet: %s", e)
            return False

    def _check_local_head(self) -> None:
        """A managed head whose processes are all gone (killed, OOM) is started again on the next tick;
        its jobs are then reconciled as lost. A merely slow head is left alone."""
        if self.ray is None or self.local_cluster is None or self.ray.ping():
            return
        if not self.local_cluster.core_processes():
            log.error("the managed Ray head is gone; starting a new one")
            self.ray, self.ray_error, self._reconciled = (
                None,
                "the managed Ray head died; restarting it",
                False,
            )

    def ray_ready(self) -> bool:
        return self.ray is not None and self.ray.ping()

    def _connected(self) -> RayJobs:
        if self.ray is None:
            raise SchedulerInvariantError(
                "the scheduler is not connected to Ray: tick() runs after _connect()"
            )
        return self.ray

    @staticmethod
    def _required(job: JobRow, field: str, value: str | None) -> str:
        if not value:
            raise SchedulerInvariantError(f"job {job.id} ({job.state}) has no {field} here")
        return value

    # -- one pass ---------------------------------------------------------------------------------
    def tick(self) -> None:
        self._connected()
        if not self._reconciled:
            for job in self.store.on_ray():
                self._ingest_run_dir(job)
            self._reconciled = True
        for job in self.store.on_ray():
            self._monitor(job)
        for job in self.store.active_jobs():
            if job.cancel_requested_at is not None:
                self._enforce_cancel(job)
        self._admit()

    def _ingest_run_dir(self, job: JobRow) -> JobRow:
        """Take in what the trainer wrote locally but could not report (we were down, or it was cut off)."""
        events = progress.read_run_dir_events(job.run_dir)
        if events:
            result = progress.ingest(self.store, job.id, job.attempt, events)
            if result.stored:
                log.info("job %s: recovered %d events from %s", job.id, len(result.stored), job.run_dir)
            return result.job
        return job

    def _monitor(self, job: JobRow) -> None:
        ray = self._connected()
        sub_id = self._required(job, "Ray submission id", job.ray_submission_id)
        info = ray.info(sub_id)
        if info is None:
            if job.state == JobState.STARTING and job.reported_at is None:
                # Recorded as starting but never reached Ray (we stopped in between): submit it now.
                self._submit(job)
                return
            job = self._ingest_run_dir(job)
            if job.state not in TERMINAL:
                self._finish(
                    job,
                    JobState.FAILED,
                    f"Ray has no job {job.ray_submission_id}: the cluster was restarted or lost; "
                    "resume the job from its last checkpoint",
                )
            self.store.update(job.id, ray_done=True)
            return
        if not info.finished:
            # The trainer said it ended but its driver lingers (stuck teardown): stop it after the grace.
            if (
                job.state in TERMINAL
                and job.finished_at
                and time.time() - job.finished_at > self.settings.cancel_grace_s
                and sub_id not in self._lingering_stopped
            ):
                self._lingering_stopped.add(sub_id)
                ray.stop(sub_id)
                self.store.log_event(
                    job,
                    f"the trainer ended {job.state} but its Ray job was still alive after "
                    f"{self.settings.cancel_grace_s:.0f}s; stopped it",
                    level="warning",
                )
            return
        job = self._ingest_run_dir(job)
        self._keep_driver_log(job)
        if job.state not in TERMINAL:
            if info.status == "SUCCEEDED":
                self._finish(
                    job, JobState.SUCCEEDED, "the trainer exited successfully without reporting its end"
                )
            elif info.status == "STOPPED" and job.cancel_requested_at is not None:
                self._finish(
                    job,
                    JobState.CANCELLED,
                    f"{job.cancel_reason}; the Ray job was stopped",
                    hard_stopped=True,
                )
            elif info.status == "STOPPED":
                self._finish(job, JobState.FAILED, "the Ray job was stopped outside the control plane")
            else:
                self._finish(job, JobState.FAILED, f"the trainer failed: {_last_lines(info.message)}")
        self.store.update(job.id, ray_done=True)

    def _keep_driver_log(self, job: JobRow) -> None:
        try:
            text = self.ray.logs(job.ray_submission_id) if self.ray and job.ray_submission_id else None
        except Exception as e:  # logs are a convenience; never block finishing the job on them
            log.warning("job %s: could not fetch the driver log: %s", job.id, e)
            return
        if text is not None:
            self.store.save_driver_log(job.id, job.attempt, text)

    def _finish(self, job: JobRow, state: JobState, reason: str, **fields: object) -> None:
        try:
            self.store.transition(job.id, state, reason, expect=frozenset({job.state}), **fields)
        except InvalidTransition:
            return  # the trainer's own report got there first
        self.telemetry.job_finished(state, hard=bool(fields.get("hard_stopped")))

    def _enforce_cancel(self, job: JobRow) -> None:
        ray = self._connected()
        if job.cancel_requested_at is None:
            raise SchedulerInvariantError(f"job {job.id}: enforcing a cancel that was never requested")
        waited = time.time() - job.cancel_requested_at
        never_reported = job.state == JobState.STARTING and job.reported_at is None
        if not never_reported and waited < self.settings.cancel_grace_s:
            return
        if job.ray_submission_id:
            ray.stop(job.ray_submission_id)
        if never_reported:
            reason = f"{job.cancel_reason} (before the trainer started; its Ray job was stopped)"
        else:
            reason = (
                f"{job.cancel_reason}; the trainer did not stop within {self.settings.cancel_grace_s:.0f}s "
                f"of the cancel, so its Ray job was stopped hard"
                + (f" after step {job.step}" if job.step is not None else "")
            )
        self._finish(job, JobState.CANCELLED, reason, hard_stopped=not never_reported)

    # -- admission --------------------------------------------------------------------------------
    def _admit(self) -> None:
        full: set[str] = set()
        for job in self.store.queued():
            if job.tenant in full:
                continue
            quota = self.token_store.quota(job.tenant)
            quota = self.settings.default_max_concurrent_jobs if quota is None else quota
            if self.store.active_count(job.tenant) >= quota:
                full.add(job.tenant)
                continue
            self._launch(job)

    def _launch(self, job: JobRow) -> None:
        run_dir = (
            Path(self.settings.runs_dir or self.settings.data_dir / "runs")
            / job.id
            / f"attempt-{job.attempt}"
        )
        sub_id = submission_id(job.id, job.attempt)
        try:
            job = self.store.start_attempt(job, sub_id, str(run_dir))
        except InvalidTransition:
            return  # cancelled meanwhile
        self._submit(job)

    def _submit(self, job: JobRow) -> None:
        """Write the attempt's spec, mint its reporting token and hand the driver to Ray."""
        ray = self._connected()
        run_dir_name = self._required(job, "run directory", job.run_dir)
        sub_id = self._required(job, "Ray submission id", job.ray_submission_id)
        secret = tokens.mint(tokens.JOB_PREFIX)
        try:
            run_dir = Path(run_dir_name)
            run_dir.mkdir(parents=True, exist_ok=True)
            spec_path = run_dir / SPEC_FILE
            # parse 2 of 3 (docs/architecture.md): the stored spec, checked again where it leaves the database
            # (the server may have been upgraded since the submission) and normalised for the trainer
            spec_path.write_text(JobSpec.parse(job.spec, source=f"job {job.id}").to_yaml())
        except Exception as e:  # an unwritable runs_dir, or a spec the current schema no longer accepts
            log.exception("job %s: preparing the run dir failed", job.id)
            self._fail_submission(job, f"could not prepare the run directory {job.run_dir}: {e}")
            return
        self.store.update(job.id, job_token_hash=tokens.digest(secret))
        cmd = [
            self.settings.trainer_python,
            "-m",
            "tgc_rl.trainer",
            "--spec",
            str(spec_path),
            "--run-dir",
            str(run_dir),
        ]
        if job.resume_from:
            cmd += ["--resume", job.resume_from]
        env = {
            **self.settings.trainer_env,
            "TGC_CONTROL_URL": self.settings.control_url,
            "TGC_JOB_ID": job.id,
            "TGC_JOB_TOKEN": secret,
            GRANTS_ENV: job.grants,
            DATASETS_DIR_ENV: str(self.settings.datasets_path.resolve()),
            LIMITS_ENV: data_limits(self.settings).to_json(),
        }
        if self.settings.data_root is not None:
            env[DATA_ROOT_ENV] = str(self.settings.data_root)
        meta = {"tgc_job_id": job.id, "tgc_tenant": job.tenant, "tgc_attempt": str(job.attempt)}
        try:
            ray.submit(sub_id, shlex.join(cmd), env, meta)
        except (RayUnavailable, OSError) as e:  # requests' connection errors are OSErrors
            # Ray (or the network to it) is down: the job stays `starting`; monitoring resubmits it once
            # Ray answers again (the submission id is deterministic, so it never runs twice).
            log.warning("job %s: Ray unreachable at submission, will retry: %s", job.id, e)
            return
        except Exception as e:
            log.exception("job %s: submission failed", job.id)
            self._fail_submission(job, f"could not submit to Ray: {e}")
            return
        log.info("job %s: submitted to Ray as %s", job.id, job.ray_submission_id)

    def _fail_submission(self, job: JobRow, reason: str) -> None:
        self._finish(job, JobState.FAILED, reason)
        self.store.update(job.id, ray_done=True)


class RetentionSweeper:
    """Every `retention_sweep_s`: delete ended jobs past `job_retention_s` / `max_ended_jobs_per_tenant`."""

    def __init__(self, store: JobStore, settings: ControlSettings):
        self.store = store
        self.settings = settings
        self.runs_dir = Path(settings.runs_dir or settings.data_dir / "runs")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.settings.job_retention_s or self.settings.max_ended_jobs_per_tenant)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tgc-retention", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sweep()
            except Exception:
                log.exception("retention sweep failed; retrying next period")
            self._stop.wait(self.settings.retention_sweep_s)

    def sweep(self, batch: int = 500) -> int:
        """One pass; returns how many jobs were deleted."""
        total = 0
        while not self._stop.is_set():
            gone = self.store.expire_ended(
                self.settings.job_retention_s, self.settings.max_ended_jobs_per_tenant, batch=batch
            )
            for job in gone:
                self._remove_run_dir(job.id)
            total += len(gone)
            if len(gone) < batch:
                break
        if total:
            log.info("retention: deleted %d ended jobs and their run directories", total)
        return total

    def _remove_run_dir(self, job_id: str) -> None:
        """`<runs_dir>/<job id>` (every attempt): the scheduler made it; nothing outside runs_dir is touched."""
        if not _RUN_DIR_NAME.fullmatch(job_id):  # not an id this server mints (`job-<hex>`): touch nothing
            return
        path = self.runs_dir / job_id
        try:
            if path.is_symlink():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
        except OSError as e:
            log.warning("retention: could not remove %s: %s", path, e)


def _last_lines(message: str, n: int = 15, max_chars: int = 4000) -> str:
    lines = [ln for ln in (message or "").strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:])[-max_chars:] or "no message from Ray"
