"""Control planes for tests: real servers (uvicorn in a child process, SQLite) on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from services.control.local import LocalControlPlane


@dataclass
class ApiServer:
    """A control plane without Ray (scheduler off: jobs stay queued) and three callers' tokens."""

    cp: LocalControlPlane
    acme: str  # tenant token
    globex: str  # another tenant's token
    admin: str

    @property
    def url(self) -> str:
        return self.cp.url


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextmanager
def control_plane_with_ray(data_dir: Path, *args: str) -> Iterator[LocalControlPlane]:
    """A started control plane that runs jobs on its managed local Ray head; both are stopped on exit."""
    from services.control.ray_cluster import LocalRayCluster

    cp = LocalControlPlane(data_dir, ray_address="local", args=("--poll-interval", "0.5", *args))
    cp.start()
    try:
        cp.wait_ready()
        yield cp
    finally:
        cp.stop()
        LocalRayCluster(data_dir).stop()
