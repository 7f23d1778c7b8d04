"""Typed errors of the SDK: one class per kind of failure, each carrying the server's message."""

from __future__ import annotations

from typing import Any


class TgcError(Exception):
    """Base of every SDK error. `status` is the HTTP status (None for connection failures)."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        code: str = "",
        detail: list[dict[str, Any]] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.detail = detail or []

    @property
    def fields(self) -> dict[str, str]:
        """Bad field path -> message, for `Invalid` errors."""
        return {d.get("field", ""): d.get("msg", "") for d in self.detail}


class Invalid(TgcError):
    """400/422: the request (usually the job spec) is invalid; `fields` names each bad field."""


class Unauthorized(TgcError):
    """401: missing, invalid or revoked token."""


class Forbidden(TgcError):
    """403: the token may not do this (e.g. list other tenants' jobs without admin rights)."""


class NotFound(TgcError):
    """404: no such job (or it belongs to another tenant)."""


class Conflict(TgcError):
    """409: not possible in the job's state (cancel an ended job, reuse an Idempotency-Key, ...)."""


class TooLarge(TgcError):
    """413: the request body exceeds the server's limit."""


class RateLimited(TgcError):
    """429: too many requests (retried with backoff before this is raised)."""


class ServerError(TgcError):
    """5xx: the server failed (retried with backoff before this is raised, where safe)."""


class Unavailable(TgcError):
    """The server could not be reached (after retries)."""


class WaitTimeout(TgcError, TimeoutError):
    """`Job.wait(timeout)` ran out before the job ended."""


_BY_STATUS: dict[int, type[TgcError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Invalid,
    429: RateLimited,
}


def error_for(status: int, body: Any, fallback_text: str = "") -> TgcError:
    """The typed error for an HTTP error response (body: the decoded ErrorBody, if any)."""
    message, code, detail = fallback_text or f"HTTP {status}", "", []
    if isinstance(body, dict):
        message = str(body.get("message") or body.get("detail") or message)
        code = str(body.get("error") or "")
        raw = body.get("detail")
        detail = [d for d in raw if isinstance(d, dict)] if isinstance(raw, list) else []
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else TgcError)
    return cls(message, status=status, code=code, detail=detail)
