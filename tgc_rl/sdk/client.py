"""`Client`: the control plane's REST API in Python (httpx + pydantic, no torch, no Ray).

    from tgc_rl.sdk import Client
    client = Client("http://127.0.0.1:8080", token)
    job = client.submit("job.yaml")        # a path, a dict, or a JobSpec (any pydantic model of one)
    for event in job.stream():              # state changes, step metrics, checkpoints, log lines
        print(event.type, event.data)
    job.wait().state                        # 'succeeded'

Transient failures (connection errors, 429/502/503/504) are retried with exponential backoff and
jitter. A submission carries an Idempotency-Key (a fresh one unless given), so a retried POST never
creates a second job.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeAlias

import httpx
import yaml
from pydantic import BaseModel

from tgc_rl.sdk.errors import TgcError, Unavailable, error_for
from tgc_rl.sdk.job import Job
from tgc_rl.wire import DatasetList, DatasetRecord

DEFAULT_URL = "http://127.0.0.1:8080"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


# A spec as a JobSpec (tgc_rl.config, the full install), a mapping or a YAML file's path. The SDK takes any
# pydantic model rather than importing JobSpec: the server validates every spec anyway (its trust boundary).
SpecSource: TypeAlias = BaseModel | Mapping[str, Any] | str | Path


def spec_to_dict(spec: SpecSource) -> dict[str, Any]:
    """A job spec as the JSON body: from a JobSpec, a mapping, or a YAML file path."""
    if isinstance(spec, BaseModel):
        return spec.model_dump(mode="json", by_alias=True)  # what JobSpec.to_dict() writes
    if isinstance(spec, Mapping):
        return dict(spec)
    path = Path(spec)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise TgcError(f"cannot read job spec {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise TgcError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise TgcError(f"{path}: the top level of a job spec must be a mapping")
    return data


class Client:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ):
        """`url`/`token` default to the TGC_URL / TGC_TOKEN environment variables."""
        self.url = (url or os.environ.get("TGC_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("TGC_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers["User-Agent"] = "tgc-sdk/1"
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport --------------------------------------------------------------------------------
    def _sleep_before_retry(self, attempt: int, retry_after: str | None = None) -> None:
        delay = min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + random.random() / 2)
        if retry_after and retry_after.isdigit():
            delay = min(self.max_backoff, float(retry_after))
        time.sleep(delay)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotent: bool | None = None,
    ) -> httpx.Response:
        """Send a request; retry what is safe to retry; raise the typed error of a failed answer."""
        idempotent = (method.upper() in _SAFE_METHODS) if idempotent is None else idempotent
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                r = self._http.request(
                    method, path, json=json, content=content, params=params, headers=headers
                )
            except httpx.ConnectError as e:  # nothing reached the server: always safe to retry
                last = e
            except (httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError) as e:
                if not idempotent:
                    raise Unavailable(
                        f"{method} {path}: {type(e).__name__}: {e} (not retried: not idempotent)"
                    ) from e
                last = e
            else:
                if (
                    r.status_code in RETRY_STATUSES
                    and (idempotent or r.status_code == 429)
                    and attempt < self.retries
                ):
                    self._sleep_before_retry(attempt, r.headers.get("Retry-After"))
                    continue
                if r.status_code >= 400:
                    try:
                        body = r.json()
                    except ValueError:
                        body = None
                    raise error_for(r.status_code, body, r.text[:500])
                return r
            if attempt < self.retries:
                self._sleep_before_retry(attempt)
        raise Unavailable(f"{self.url} is unreachable after {self.retries + 1} tries: {last}")

    def stream_lines(self, path: str, params: Mapping[str, Any], headers: Mapping[str, str]) -> Iterator[str]:
        """The lines of a streaming response (server-sent events); raises typed errors like `request`."""
        with self._http.stream(
            "GET", path, params=params, headers=headers, timeout=httpx.Timeout(30.0, read=90.0)
        ) as r:
            if r.status_code >= 400:
                r.read()
                try:
                    body = r.json()
                except ValueError:
                    body = None
                raise error_for(r.status_code, body, r.text[:500])
            yield from r.iter_lines()

    # -- jobs -------------------------------------------------------------------------------------
    def submit(
        self,
        spec: SpecSource,
        *,
        idempotency_key: str | None = None,
    ) -> Job:
        """Submit a job; the server validates the spec fully (`Invalid` names each bad field)."""
        key = idempotency_key or str(uuid.uuid4())
        r = self.request(
            "POST", "/v1/jobs", json=spec_to_dict(spec), headers={"Idempotency-Key": key}, idempotent=True
        )
        return Job(self, r.json())

    def validate(self, spec: SpecSource) -> dict[str, Any]:
        """Dry run: the server's verdict on a spec (schema and its policy); returns the normalized spec."""
        r = self.request(
            "POST", "/v1/jobs", json=spec_to_dict(spec), params={"dry_run": "true"}, idempotent=True
        )
        return r.json()["spec"]

    def job(self, job_id: str) -> Job:
        return Job(self, self.request("GET", f"/v1/jobs/{job_id}").json())

    def iter_jobs(
        self, state: str | list[str] | None = None, *, tenant: str | None = None, page_size: int = 100
    ) -> Iterator[Job]:
        """All matching jobs, newest first, fetched page by page."""
        params: dict[str, Any] = {"limit": page_size}
        if state:
            params["state"] = [state] if isinstance(state, str) else list(state)
        if tenant:
            params["tenant"] = tenant
        while True:
            page = self.request("GET", "/v1/jobs", params=params).json()
            for record in page["jobs"]:
                yield Job(self, record)
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]

    def jobs(
        self, state: str | list[str] | None = None, *, limit: int | None = 100, tenant: str | None = None
    ) -> list[Job]:
        """Matching jobs, newest first, at most `limit` (None: all)."""
        out: list[Job] = []
        for job in self.iter_jobs(state, tenant=tenant, page_size=min(limit or 500, 500)):
            out.append(job)
            if limit is not None and len(out) >= limit:
                break
        return out

    def evaluate(self, spec: SpecSource, *, idempotency_key: str | None = None) -> Job:
        """Evaluate the spec's model on its `eval` rows without training (a job with `steps: 0`); once it has
        succeeded, `job.metrics()[0].metrics` holds the `eval/...` figures."""
        return self.submit({**spec_to_dict(spec), "steps": 0}, idempotency_key=idempotency_key)

    # -- datasets ---------------------------------------------------------------------------------
    def upload_dataset(self, path: str | Path, name: str | None = None) -> DatasetRecord:
        """Upload a JSONL / Parquet / CSV file; jobs then name it as `task.params.dataset_id: <id>`. The same
        content uploaded again returns the existing dataset."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise TgcError(f"cannot read {path}: {e.strerror}") from None
        # retried safely: an identical upload returns the dataset the first one created
        r = self.request(
            "POST",
            "/v1/datasets",
            content=data,
            params={"name": name or path.name},
            headers={"Content-Type": "application/octet-stream"},
            idempotent=True,
        )
        return DatasetRecord.model_validate(r.json())

    def datasets(self) -> list[DatasetRecord]:
        """This tenant's datasets, newest first (an admin token: every tenant's)."""
        return DatasetList.model_validate(self.request("GET", "/v1/datasets").json()).datasets

    def dataset(self, dataset_id: str) -> DatasetRecord:
        return DatasetRecord.model_validate(self.request("GET", f"/v1/datasets/{dataset_id}").json())

    def delete_dataset(self, dataset_id: str) -> None:
        self.request("DELETE", f"/v1/datasets/{dataset_id}")

    # -- server -----------------------------------------------------------------------------------
    def schema(self) -> dict[str, Any]:
        """The job spec's JSON schema as the server knows it."""
        return self.request("GET", "/v1/schema").json()

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self) -> dict[str, Any]:
        """The server's readiness checks (`{"ready": bool, "checks": {...}}`)."""
        try:
            return self._http.get("/readyz", timeout=10).json()
        except (httpx.HTTPError, ValueError) as e:
            return {"ready": False, "checks": {"server": f"down: {e}"}}
