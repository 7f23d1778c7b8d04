"""Run the control plane under uvicorn (`tgc serve`)."""

from __future__ import annotations

import logging

import uvicorn

from tgc_rl.control.app import create_app
from tgc_rl.control.limits import header_deadline_protocol
from tgc_rl.control.settings import ControlSettings


def serve(settings: ControlSettings, log_level: str = "info") -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Ray poll otherwise
    app = create_app(settings)
    if not app.state.cp.token_store.list():
        logging.getLogger("tgc_rl.control").warning(
            "no API tokens exist yet: create one with `tgc token create --tenant NAME` (same --data-dir/--db-url)"
        )
    # Access logs name method, path and status only: tokens travel in headers and are never logged.
    # Slow clients: idle keep-alive connections and trickled headers are cut off (bodies: BodyReadTimeout).
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        proxy_headers=False,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=settings.keep_alive_s,
        http=header_deadline_protocol(settings.client_header_timeout_s),
    )
