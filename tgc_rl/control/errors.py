"""One error shape for every failure (`tgc_rl.wire.ErrorBody`), with field paths for invalid input."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.utils import get_flat_dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from tgc_rl.config import error_message, field_path
from tgc_rl.wire import ErrorBody, ErrorDetail

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "too_many_requests",
    503: "unavailable",
}


# FastAPI's message when json.loads fails, including a RecursionError on a body nested ~1,000 levels deep
_BODY_UNREADABLE = (
    "the body is not JSON this server can read (malformed, or nested too deeply for the parser); "
    "send a JSON object (`tgc schema` prints the job spec's schema)"
)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        detail: list[ErrorDetail] | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.code = code or _CODES.get(status, "error")
        self.message = message
        self.detail = detail or []
        self.headers = headers


def error_response(
    status: int,
    code: str,
    message: str,
    detail: list[ErrorDetail] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=code, message=message, detail=detail or [])
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


# id(route) -> (route, its query parameter names); routes are not hashable. Holding the route keeps its
# id from being reused; there are as many entries as routes of the apps this process built.
_QUERY_NAMES: dict[int, tuple[Any, frozenset[str]]] = {}


def _query_names(route: Any) -> frozenset[str]:
    cached = _QUERY_NAMES.get(id(route))
    if cached is not None and cached[0] is route:
        return cached[1]
    dependant = getattr(route, "dependant", None)
    names = (
        frozenset()
        if dependant is None
        else frozenset(p.alias for p in get_flat_dependant(dependant).query_params)
    )
    _QUERY_NAMES[id(route)] = (route, names)
    return names


def refuse_unknown_query(request: Request) -> None:
    """An app-wide dependency: a query parameter the operation does not declare is a 422 naming it, never
    silently ignored (a misspelt `?stat=failed` would otherwise list every job). Every operation documents
    the 422 (tgc_rl/control/openapi.py)."""
    route = request.scope.get("route")
    if not getattr(route, "include_in_schema", True):
        return  # a page for people (the docs UI), not an operation of the published API
    known = _query_names(route)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        named = [name[:64] for name in unknown[:8]]  # the client's own strings: echo a bounded few
        hint = f"known: {', '.join(sorted(known))}" if known else "this operation takes none"
        raise ApiError(
            422,
            f"unknown query parameter(s) {', '.join(named)}; remove them ({hint})",
            [
                ErrorDetail(field=name, msg=f"unknown query parameter; {hint}", type="extra_forbidden")
                for name in named
            ],
        )


def _field(loc: tuple) -> str:
    # ("body", "model", "source") -> "model.source"; ("query", "limit") -> "limit"; the task union's tag dropped
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    return field_path(loc) or "(body)"


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
        detail = [
            ErrorDetail(
                field=_field(tuple(err.get("loc", ()))), msg=_message(err), type=str(err.get("type", ""))
            )
            for err in e.errors()
        ]
        lines = "\n".join(f"  {d.field}: {d.msg}" for d in detail)
        return error_response(422, "invalid", f"invalid request\n{lines}", detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        message = _BODY_UNREADABLE if e.detail == "There was an error parsing the body" else str(e.detail)
        headers = getattr(e, "headers", None)
        if e.status_code == 405:
            # the router's Allow names only the first route of the path; a path may have one route per method
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return error_response(e.status_code, _CODES.get(e.status_code, "error"), message, None, headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers on the request's path."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if getattr(route, "methods", None) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return sorted(methods)
