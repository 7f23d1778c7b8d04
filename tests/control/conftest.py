"""Fixtures of the control-plane tests (the server itself: `api_server` in tests/conftest.py)."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def http(api_server):
    """An HTTP client of the module's server (no token: each call sends its own)."""
    with httpx.Client(base_url=api_server.url, timeout=30) as c:
        yield c
