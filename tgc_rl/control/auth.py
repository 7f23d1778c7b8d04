"""Who is calling: tenant tokens for the API, per-job tokens for a trainer's reports."""

from __future__ import annotations

import hmac
import math

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tgc_rl.control import tokens
from tgc_rl.control.errors import ApiError
from tgc_rl.control.store import JobRow
from tgc_rl.control.tokens import Principal

bearer = HTTPBearer(auto_error=False, description="A tenant token from `tgc token create`.")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def current_principal(
    request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> Principal:
    if creds is None:
        raise ApiError(
            401,
            "missing bearer token: send `Authorization: Bearer <token>` "
            "(an operator creates one with `tgc token create --tenant NAME`)",
            headers=_CHALLENGE,
        )
    cp = request.app.state.cp
    principal = cp.token_store.authenticate(creds.credentials)
    if principal is None:
        raise ApiError(401, "invalid or revoked token", headers=_CHALLENGE)
    wait = cp.rate_limiter.acquire(principal.token_id)
    if wait:
        retry_after = max(1, math.ceil(wait))
        raise ApiError(
            429,
            f"too many requests with this token: this server allows {cp.settings.rate_limit_per_s:g} "
            f"a second on average and bursts of {cp.settings.rate_limit_burst} (server settings "
            f"rate_limit_per_s, rate_limit_burst); retry after {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )
    return principal


def metrics_reader(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
    """/metrics names tenants in its labels: only Prometheus (the operator's metrics token) or an admin reads it."""
    expected = request.app.state.cp.settings.metrics_token
    if creds is not None and expected and hmac.compare_digest(creds.credentials.encode(), expected.encode()):
        return
    principal = (
        request.app.state.cp.token_store.authenticate(creds.credentials) if creds is not None else None
    )
    if principal is None or not principal.is_admin:
        raise ApiError(
            401,
            "/metrics needs the metrics token (server setting metrics_token, TGC_METRICS_TOKEN) or "
            "an admin token",
            headers=_CHALLENGE,
        )


def reporting_job(
    request: Request, job_id: str, creds: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> JobRow:
    """The job whose current attempt owns the presented job token (constant-time comparison)."""
    if creds is None or not creds.credentials.startswith(tokens.JOB_PREFIX):
        raise ApiError(401, "a job token (TGC_JOB_TOKEN) is required", headers=_CHALLENGE)
    job = request.app.state.cp.store.get(job_id)
    expected = job.job_token_hash if job is not None else None
    if not expected or not hmac.compare_digest(expected, tokens.digest(creds.credentials)):
        raise ApiError(401, "invalid job token for this job (or a previous attempt's)", headers=_CHALLENGE)
    return job
