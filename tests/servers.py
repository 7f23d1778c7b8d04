"""Control planes for tests: real servers (uvicorn in a child process, SQLite) on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tgc_rl.control.local import LocalControlPlane


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


def arm(api_server: ApiServer, job_id: str, run_dir: Path) -> str:
    """Do what the scheduler does at submission on a server without Ray: mark the job starting with `run_dir`
    and mint its reporting token (returned: what a trainer's Reporter sends)."""
    from tgc_rl.control import tokens
    from tgc_rl.control.db import make_engine
    from tgc_rl.control.store import JobStore

    engine = make_engine(f"sqlite:///{(api_server.cp.data_dir / 'tgc.db').resolve()}")
    try:
        store = JobStore(engine)
        store.start_attempt(store.get(job_id), f"tgc-{job_id}-1", str(run_dir))
        secret = tokens.mint(tokens.JOB_PREFIX)
        store.update(job_id, job_token_hash=tokens.digest(secret))
    finally:
        engine.dispose()
    return secret


@contextmanager
def control_plane_with_ray(data_dir: Path, *args: str) -> Iterator[LocalControlPlane]:
    """A started control plane that runs jobs on its managed local Ray head; both are stopped on exit."""
    from tgc_rl.control.ray_cluster import LocalRayCluster

    cp = LocalControlPlane(data_dir, ray_address="local", args=("--poll-interval", "0.5", *args))
    cp.start()
    try:
        cp.wait_ready()
        yield cp
    finally:
        cp.stop()
        LocalRayCluster(data_dir).stop()
