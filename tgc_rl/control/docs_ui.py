"""The interactive API docs (`/docs`, Swagger UI) served from a packaged Swagger UI distribution.

FastAPI's own `/docs` page loads Swagger UI's script and styles from a CDN: a blank page on any machine
without internet (a cluster's private network, an air-gapped site). Here every asset comes from the
`swagger-ui-bundle-v2` package, mounted under `<docs_url>/assets`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path


def install_docs_ui(app: FastAPI, docs_url: str = "/docs") -> None:
    """Serve Swagger UI for `app.openapi_url` at `docs_url` (create the app with `docs_url=None`)."""
    if app.openapi_url is None:
        raise ValueError("the docs UI needs the OpenAPI document: create the app with an openapi_url")
    assets = f"{docs_url.rstrip('/')}/assets"
    app.mount(assets, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")
    openapi_url = app.openapi_url

    @app.get(docs_url, include_in_schema=False)
    def docs(request: Request) -> HTMLResponse:
        # Behind a path prefix (root_path), the browser must ask for the prefixed URLs.
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{assets}/swagger-ui.css",
            swagger_favicon_url=f"{root}{assets}/favicon-32x32.png",
        )
