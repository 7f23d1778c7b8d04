"""Fixtures of the control-plane tests: real servers (uvicorn in a child process) on loopback."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from services.control.local import LocalControlPlane


@dataclass
class ApiServer:
    cp: LocalControlPlane
    acme: str  # tenant token
    globex: str  # another tenant's token
    admin: str

    @property
    def url(self) -> str:
        return self.cp.url


@pytest.fixture(scope="module")
def api_server(tmp_path_factory) -> ApiServer:
    """A control plane without Ray (scheduler off): jobs stay queued, everything else is real."""
    cp = LocalControlPlane(tmp_path_factory.mktemp("cp"), ray_address="none")
    acme, globex, admin = (
        cp.create_token("acme"),
        cp.create_token("globex"),
        cp.create_token("ops", admin=True),
    )
    with cp:
        yield ApiServer(cp, acme, globex, admin)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def http(api_server):
    """An HTTP client of the module's server (no token: each call sends its own)."""
    with httpx.Client(base_url=api_server.url, timeout=30) as c:
        yield c
