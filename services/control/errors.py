"""One error shape for every failure (`schemas.ErrorBody`), with field paths for invalid input."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.config import error_message
from services.control.schemas import ErrorBody, ErrorDetail

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 413: "too_large", 415: "unsupported_media_type", 422: "invalid", 429: "too_many_requests",
          503: "unavailable"}  # fmt: skip


# FastAPI's message when json.loads fails, including a RecursionError on a body nested ~1,000 levels deep
_BODY_UNREADABLE = (
    "the body is not JSON this server can read (malformed, or nested too deeply for the parser); "
    "send a JSON object (`tgc schema` prints the job spec's schema)"
)


class ApiError(Exception):
    def __init__(self, status: int, message: str, detail: list[ErrorDetail] | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status = status
        self.code = code or _CODES.get(status, "error")
        self.message = message
        self.detail = detail or []
        self.headers = headers


def error_response(status: int, code: str, message: str, detail: list[ErrorDetail] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:  # fmt: skip
    body = ErrorBody(error=code, message=message, detail=detail or [])
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _field(loc: tuple) -> str:
    # ("body", "model", "source") -> "model.source"; ("query", "limit") -> "limit"
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "(body)"


def _message(err: dict) -> str:
    if err.get("type") == "extra_forbidden":
        return "unknown field; remove it or check its spelling (see `tgc schema`)"
    if err.get("type") == "missing" and err.get("loc", ())[:1] == ("body",) and len(err["loc"]) == 1:
        return "a JSON body is required"
    return error_message(err)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return error_response(e.status, e.code, e.message, e.detail, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        detail = [ErrorDetail(field=_field(tuple(err.get("loc", ()))), msg=_message(err), type=str(err.get("type", "")))
                  for err in e.errors()]  # fmt: skip
        lines = "\n".join(f"  {d.field}: {d.msg}" for d in detail)
        return error_response(422, "invalid", f"invalid request\n{lines}", detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        message = _BODY_UNREADABLE if e.detail == "There was an error parsing the body" else str(e.detail)
        return error_response(e.status_code, _CODES.get(e.status_code, "error"), message, None,
                              getattr(e, "headers", None))  # fmt: skip
