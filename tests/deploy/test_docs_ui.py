"""`/docs` works offline: Swagger UI's assets come from the control plane itself, and a real browser
(headless Chromium, no network but loopback) renders the job operations from the OpenAPI document."""

from __future__ import annotations

import re
import subprocess

import httpx
import pytest

from tests.browser import CHROMIUM, headless_chromium
from tgc_rl.control.local import LocalControlPlane


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with LocalControlPlane(tmp_path_factory.mktemp("cp"), ray_address="none") as cp:
        yield cp


def test_docs_page_names_only_local_assets(server):
    html = httpx.get(f"{server.url}/docs", timeout=10).text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)""", html) + re.findall(r"url: '([^']+)'", html)
    assert urls, html
    assert all(u.startswith("/") for u in urls), urls
    for u in urls:
        assert httpx.get(f"{server.url}{u}", timeout=10).status_code == 200, u


def test_fastapi_cdn_pages_are_off(server):
    assert httpx.get(f"{server.url}/redoc", timeout=10).status_code == 404


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"
)
def test_headless_chromium_renders_the_job_operations(server, tmp_path):
    cmd = [
        *headless_chromium(tmp_path),
        "--virtual-time-budget=15000",
        "--dump-dom",
        f"{server.url}/docs",
    ]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    operations = set(re.findall(r'opblock-summary-method">(\w+)</span>.*?data-path="([^"]+)"', dom))
    assert {
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/{job_id}"),
        ("POST", "/v1/jobs/{job_id}/cancel"),
    } <= operations, dom[:2000]
