"""The job console (`/console`): a few static files served by the control plane itself (no CDN, like `/docs`).

The page holds no data and needs no login to load; everything it shows comes from the REST API with the
bearer token the person pastes (kept in the tab's sessionStorage), so a tenant sees exactly what its token
may see through the API. A strict Content-Security-Policy allows only this server's own scripts and
connections; job names, samples and logs reach the page as text, never as HTML (a model's output is
untrusted input).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from tgc_rl.run_layout import CURVE_PANELS

ASSETS = Path(__file__).with_name("console_assets")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
LOG_SCALE_PANELS = frozenset({"cancellation residual"})  # D1/D2 span 1e-9 .. 1: drawn as log10


def install_console(app: FastAPI, url: str = "/console") -> None:
    """Serve the console at `url` (its files under `url/`)."""
    panels = [
        {
            "title": title,
            "log": title in LOG_SCALE_PANELS,
            "metrics": [{"name": n, "label": lb} for n, lb in series],
        }
        for title, series in CURVE_PANELS
    ]

    @app.get(url, include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(ASSETS / "index.html", headers=SECURITY_HEADERS)

    @app.get(f"{url}/panels.json", include_in_schema=False)
    def console_panels() -> JSONResponse:
        return JSONResponse(panels, headers=SECURITY_HEADERS)

    app.mount(url, StaticFiles(directory=ASSETS), name="console-assets")
