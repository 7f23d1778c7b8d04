"""A real control plane (uvicorn child process, SQLite, no Ray: jobs stay queued) for the SDK tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.control.local import LocalControlPlane


@dataclass
class Server:
    cp: LocalControlPlane
    acme: str
    globex: str

    @property
    def url(self) -> str:
        return self.cp.url


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    cp = LocalControlPlane(tmp_path_factory.mktemp("cp"), ray_address="none")
    acme, globex = cp.create_token("acme"), cp.create_token("globex")
    with cp:
        yield Server(cp, acme, globex)
