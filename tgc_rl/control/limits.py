"""Request limits: body size, body read time, per-token request rate, per-tenant open streams, and the
header read deadline of each connection (slow clients)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

from fastapi import HTTPException
from fastapi.responses import StreamingResponse


def _error(status: int, code: str, message: str) -> tuple[dict, dict]:
    body = json.dumps({"error": code, "message": message, "detail": []}).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    return start, {"type": "http.response.body", "body": body}


class BodySizeLimit:
    """413 for bodies over `max_bytes`: by Content-Length up front, by counting for chunked uploads."""

    def __init__(self, app, max_bytes: int, paths: dict[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.paths = paths or {}  # exact request path -> its own limit (uploads)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.paths.get(scope.get("path", ""), self.max_bytes)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size < 0:
                await self._reply(send, 400, "bad_request", "Content-Length must be a non-negative integer")
                return
            if size > limit:
                await self._reply(send, 413, "too_large", self._too_large_message(size, limit))
                return
        seen = 0

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # FastAPI re-raises HTTPExceptions from body reading; the app's handler answers 413.
                    raise HTTPException(413, self._too_large_message(seen, limit))
            return message

        await self.app(scope, counted_receive, send)

    @staticmethod
    def _too_large_message(size: int, limit: int) -> str:
        return f"request body of {size} bytes exceeds the limit of {limit} bytes"

    @staticmethod
    async def _reply(send, status: int, code: str, message: str) -> None:
        start, body = _error(status, code, message)
        await send(start)
        await send(body)


# -- per-token request rate -------------------------------------------------------------------------
class RateLimiter:
    """A token bucket per API token: `rate` requests a second on average, bursts of up to `burst`.

    Keyed by the authenticated token's id (checked after authentication), so the table holds at most
    one bucket per valid token; an invalid token is refused by authentication before it costs a bucket.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # token id -> (tokens left, at time)
        self._lock = threading.Lock()
        self._prune_at = 4096

    def acquire(self, key: str) -> float:
        """Take one request from `key`'s bucket: 0.0 when allowed, else the seconds until one is."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            if len(self._buckets) > self._prune_at:
                self._prune(now)
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0 - 1e-9:  # (float rounding: a client that waited the answer's time gets in)
                self._buckets[key] = (max(tokens - 1.0, 0.0), now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def _prune(self, now: float) -> None:
        """Forget buckets that have refilled (revoked tokens' too): a full bucket is the same as none."""
        self._buckets = {
            k: (t, at) for k, (t, at) in self._buckets.items() if t + (now - at) * self.rate < self.burst
        }
        self._prune_at = max(4096, 2 * len(self._buckets))


# -- per-tenant open event streams --------------------------------------------------------------------
RECONNECT_MS = 1000  # SSE `retry:` sent when a stream reaches its lifetime


class StreamSlots:
    """How many event streams each tenant holds open; `acquire` refuses one beyond `limit` (0: no limit)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, tenant: str) -> bool:
        with self._lock:
            n = self._open.get(tenant, 0)
            if self.limit and n >= self.limit:
                return False
            self._open[tenant] = n + 1
            return True

    def release(self, tenant: str) -> None:
        with self._lock:
            n = self._open.get(tenant, 0) - 1
            if n > 0:
                self._open[tenant] = n
            else:
                self._open.pop(tenant, None)

    def open(self, tenant: str) -> int:
        with self._lock:
            return self._open.get(tenant, 0)


class HeldStreamingResponse(StreamingResponse):
    """A streaming response that calls `release` once it is over, however it ends (done, client gone,
    server shutting down): the slot is given back even when the body was never iterated."""

    def __init__(self, content, release: Callable[[], None], **kwargs):
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


# -- slow clients -------------------------------------------------------------------------------------
class BodyReadTimeout:
    """408 when a request's body has not fully arrived within `timeout_s` of the request's start.

    A client that trickles its body (one byte a second) would otherwise hold a connection and a worker
    for as long as it likes. Once the body is complete, `receive` passes through untimed (a streaming
    response waits on it for the client's disconnect).
    """

    def __init__(self, app, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout_s
        complete = False

        async def timed_receive():
            nonlocal complete
            if complete:
                return await receive()
            try:
                # At least a moment: a body already buffered is still taken after a slow start.
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.01))
            except TimeoutError:
                raise HTTPException(
                    408,
                    f"the request body did not arrive within {self.timeout_s:g} s (server setting "
                    "client_body_timeout_s); send it in one go, or split a large upload",
                    headers={"Connection": "close"},
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, timed_receive, send)


def header_deadline_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, closing a connection whose request headers take longer than `timeout_s`.

    uvicorn bounds the size of the headers but not the time they take: a client sending one byte a
    second holds its connection for hours. The deadline runs from the connection's opening and from the
    first byte of each further request on a kept-alive connection, and ends when the headers are parsed.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderDeadline(AutoHTTPProtocol):  # type: ignore[valid-type,misc]  # a class chosen at import
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self._between_requests():
                self._arm()
            super().data_received(data)
            if not self._between_requests():
                self._disarm()  # the headers are in: the request is the app's (and the body timeout's)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self._between_requests() and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadline
