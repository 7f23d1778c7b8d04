"""A real browser for the tests: headless Chromium (Debian's), driven over the DevTools protocol.

Background networking is off: like an air-gapped cluster, the page reaches nothing but loopback.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.proc_helpers import wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def headless_chromium(profile: Path) -> list[str]:
    """Chromium without a display, a sandbox of its own, or any network but loopback (like an air-gapped
    cluster), with its profile in `profile`; callers add what to do."""
    assert CHROMIUM is not None, "Debian's chromium is not installed (scripts/setup.sh installs it)"
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
    ]


ARTIFACTS_ENV = "TGC_TEST_ARTIFACTS"  # a folder: screenshots are copied there too (kept after a passing run)


class Browser:
    """One headless Chromium with one page; `cdp(method, **params)` calls the DevTools protocol on it."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000):
        self.profile = profile
        self.proc = subprocess.Popen(
            [
                *headless_chromium(profile),
                "--remote-debugging-port=0",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._calls = 0
        self._ws: Any = None

    def __enter__(self) -> Browser:
        from websockets.sync.client import connect

        try:
            active = self.profile / "DevToolsActivePort"
            wait_for(lambda: active.exists() and active.read_text().strip(), 60, "Chromium's DevTools port")
            port = active.read_text().split()[0]
            pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            page = next(t for t in pages if t["type"] == "page")
            self._ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    def cdp(self, method: str, **params: Any) -> dict:
        self._calls += 1
        n = self._calls
        self._ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv(timeout=60))
            if msg.get("id") == n:
                assert "error" not in msg, msg
                return msg["result"]

    def navigate(self, url: str) -> None:
        self.cdp("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.cdp("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def text(self) -> str:
        return self.js("document.body ? document.body.innerText : ''") or ""

    def wait(self, expression: str, timeout: float, what: str) -> Any:
        """The first truthy value of `expression`, polled (one that throws, e.g. while a page loads, is false)."""

        def value() -> Any:
            result = self.cdp(
                "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
            )
            return None if "exceptionDetails" in result else result["result"].get("value")

        return wait_for(value, timeout, what, every=0.3)

    def screenshot(self, path: Path) -> bytes:
        shot = base64.b64decode(self.cdp("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(shot)
        if folder := os.environ.get(ARTIFACTS_ENV):
            Path(folder).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(folder) / path.name)
        return shot


def log_in_to_console(browser: Browser, url: str, token: str) -> None:
    """What a person does on the job console (`url`/console): paste a token and open it."""
    browser.navigate(f"{url}/console")
    browser.wait(
        "document.readyState === 'complete' && document.getElementById('token') !== null", 30, "the page"
    )
    browser.js("sessionStorage.clear(); location.hash = ''; true")
    browser.navigate(f"{url}/console")
    browser.wait("!document.getElementById('login').hidden", 30, "the login form")
    browser.js(
        f"document.getElementById('token').value = {json.dumps(token)};"
        "document.getElementById('login').requestSubmit(); true"
    )
