"""Request-size limit, enforced before a body is parsed (ASGI middleware)."""

from __future__ import annotations

import json

from fastapi import HTTPException


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
