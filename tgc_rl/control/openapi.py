"""The published OpenAPI document, made to say what the server does for every operation (one home).

FastAPI describes each route from its signature; three behaviours of the app as a whole are not in any one
signature, so they are written into the document here, after FastAPI builds it:
- every operation may answer 422 in the `ErrorBody` shape (an unknown query parameter is refused, see
  `errors.refuse_unknown_query`), never FastAPI's default validation-error shape, which this app never sends;
- an operation with a JSON body may answer 400 when the body is not JSON the server can read (not UTF-8,
  or nested beyond the parser), as `errors.py` answers it;
- an optional query or header parameter is optional by being absent: the wire has no null, so the
  document does not offer one (a client sending the text `null` gets a 422);
- an operation authenticated by an API token may answer 429 (the per-token request rate, a tenant quota),
  with `Retry-After`.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from tgc_rl.control.auth import current_principal
from tgc_rl.wire import ErrorBody

_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
_ERROR_CONTENT = {"application/json": {"schema": _ERROR_REF}}
UNREADABLE_BODY: dict[str, Any] = {
    "description": "The body is not JSON this server can read (not UTF-8, or nested too deeply for the parser).",
    "content": _ERROR_CONTENT,
}
INVALID_INPUT: dict[str, Any] = {
    "description": "Invalid input (a bad value, an unknown query parameter); `detail` names each field.",
    "content": _ERROR_CONTENT,
}
TOO_MANY: dict[str, Any] = {
    "description": "Too many requests with this token, or a tenant quota reached; the message names the server "
    "setting, `Retry-After` the seconds to wait.",
    "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}},
    "content": _ERROR_CONTENT,
}
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def install_openapi(app: FastAPI) -> None:
    """Serve the adjusted document at the app's `openapi_url` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                tags=app.openapi_tags,
                servers=app.servers,
            )
            app.openapi_schema = conform(doc, token_operations(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def token_operations(app: FastAPI) -> set[tuple[str, str]]:
    """(path, method) of every operation that authenticates an API token (`auth.current_principal`)."""
    out = set()
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        stack = list(route.dependant.dependencies)
        while stack:
            dep = stack.pop()
            if dep.call is current_principal:
                out |= {(route.path_format, m.lower()) for m in route.methods}
                break
            stack.extend(dep.dependencies)
    return out


def conform(doc: dict[str, Any], token_ops: Collection[tuple[str, str]]) -> dict[str, Any]:
    """`doc` with the app-wide responses and parameter schemas above (changed in place, returned)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("ErrorBody", ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}"))
    for path, item in doc.get("paths", {}).items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            responses = op.setdefault("responses", {})
            current = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema")
            if current is None or current.get("$ref", "").endswith("/HTTPValidationError"):
                responses["422"] = INVALID_INPUT
            if "application/json" in op.get("requestBody", {}).get("content", {}):
                responses.setdefault("400", UNREADABLE_BODY)
            if (path, method) in token_ops:  # a route's own 429 (a quota of its own) keeps its description
                own = responses.get("429", {})
                responses["429"] = {
                    **TOO_MANY,
                    **own,
                    "headers": {**TOO_MANY["headers"], **own.get("headers", {})},
                }
            for param in op.get("parameters", []):
                if param.get("in") in ("query", "header") and "schema" in param:
                    param["schema"] = _without_null(param["schema"])
    for unused in (
        "HTTPValidationError",
        "ValidationError",
    ):  # FastAPI's default shape, now referenced by nothing
        if f'"#/components/schemas/{unused}"' not in json.dumps([doc["paths"], schemas]):
            schemas.pop(unused, None)
    return doc


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    options = schema.get("anyOf")
    if not options or not any(o.get("type") == "null" for o in options):
        return schema
    rest = [o for o in options if o.get("type") != "null"]
    out = {k: v for k, v in schema.items() if k != "anyOf"}
    if len(rest) == 1:
        return {**rest[0], **out}
    return {**out, "anyOf": rest}
