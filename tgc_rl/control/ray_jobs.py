"""The control plane's only door to Ray: the Ray Jobs API (`JobSubmissionClient`), imported lazily.

Submission ids are deterministic (`tgc-<job id>-<attempt>`), so submitting an attempt twice (a
retry, a restart between recording and submitting) can never start two drivers.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)

TERMINAL_RAY_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
MAX_DRIVER_LOG_CHARS = 256 * 1024


def submission_id(job_id: str, attempt: int) -> str:
    return f"tgc-{job_id}-{attempt}"


@dataclass(frozen=True)
class RayJobInfo:
    status: str  # PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED
    message: str

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_RAY_STATUSES


class RayUnavailable(RuntimeError):
    """The Ray Jobs API cannot be reached."""


def _not_found(e: Exception) -> bool:
    text = str(e)
    return "404" in text or "does not exist" in text or "not found" in text.lower()


class RayJobs:
    def __init__(self, address: str, token: str | None = None):
        """`token`: the cluster's Ray auth token, when it runs with `RAY_AUTH_MODE=token`."""
        self.address = address.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client: Any = None
        self._lock = threading.Lock()

    def _jobs(self) -> Any:
        with self._lock:
            if self._client is None:
                from ray.job_submission import JobSubmissionClient  # Ray only here, and only when used

                try:
                    self._client = JobSubmissionClient(self.address, headers=dict(self.headers) or None)
                except Exception as e:  # ConnectionError, or RuntimeError from its version check
                    raise RayUnavailable(f"Ray Jobs API at {self.address} is not reachable: {e}") from e
            return self._client

    def ping(self, timeout: float = 3.0) -> bool:
        try:
            r = httpx.get(f"{self.address}/api/jobs/", headers=self.headers, timeout=timeout)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def submit(
        self, sub_id: str, entrypoint: str, env_vars: dict[str, str], metadata: dict[str, str]
    ) -> None:
        client = self._jobs()
        try:
            client.submit_job(
                entrypoint=entrypoint,
                submission_id=sub_id,
                runtime_env={"env_vars": env_vars},
                metadata=metadata,
                entrypoint_num_cpus=0,
            )
        except RuntimeError as e:
            if "already exists" in str(e):
                log.info("Ray job %s was already submitted", sub_id)
                return
            raise

    def details(self, sub_id: str) -> Any:
        """Ray's JobDetails of a submission (status, driver pid, Ray job id), or None if unknown."""
        try:
            return self._jobs().get_job_info(sub_id)
        except RuntimeError as e:
            if _not_found(e):
                return None
            raise

    def alive_actors(self, sub_id: str) -> list[dict]:
        """Actors of the submission's Ray job that are still alive (empty once it has cleaned up)."""
        details = self.details(sub_id)
        if details is None or not details.job_id:
            return []
        r = httpx.get(
            f"{self.address}/api/v0/actors",
            headers=self.headers,
            timeout=30,
            params={
                "filter_keys": ["job_id", "state"],
                "filter_predicates": ["=", "="],
                "filter_values": [details.job_id, "ALIVE"],
                "limit": 1000,
            },
        )
        r.raise_for_status()
        return list(r.json()["data"]["result"]["result"])

    def info(self, sub_id: str) -> RayJobInfo | None:
        """The Ray job's status, or None if the cluster does not know it (restarted or lost)."""
        details = self.details(sub_id)
        if details is None:
            return None
        status = getattr(details.status, "value", str(details.status))
        return RayJobInfo(status=str(status), message=details.message or "")

    def stop(self, sub_id: str) -> bool:
        """Stop the Ray job (SIGTERM to the driver, SIGKILL a few seconds later); False if not running."""
        try:
            return bool(self._jobs().stop_job(sub_id))
        except RuntimeError as e:
            if _not_found(e):
                return False
            raise

    def logs(self, sub_id: str) -> str | None:
        """The driver's stdout/stderr (its tail), or None if the cluster does not know the job."""
        try:
            text = self._jobs().get_job_logs(sub_id)
        except RuntimeError as e:
            if _not_found(e):
                return None
            raise
        return text[-MAX_DRIVER_LOG_CHARS:]
