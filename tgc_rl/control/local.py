"""A control plane in a child process on a free loopback port: for notebooks, tests and benchmarks.

with LocalControlPlane(tmp_dir, ray_address="local") as cp:
    client = Client(cp.url, cp.create_token("acme"))
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tgc_rl.control.db import make_engine
from tgc_rl.control.migrations import migrate
from tgc_rl.control.tokens import TokenStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalControlPlane:
    def __init__(
        self,
        data_dir: str | Path,
        *,
        ray_address: str = "local",
        port: int | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        """`args`: more `tgc serve` flags, e.g. ("--cancel-grace", "30", "--max-concurrent-jobs", "1")."""
        self.data_dir = Path(data_dir)
        self.ray_address = ray_address
        self.port = port or free_port()
        self.args = args
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir / "control-plane.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> LocalControlPlane:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "tgc_rl.cli",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ray-address",
            self.ray_address,
            *self.args,
        ]
        # Only the settings given here: a TGC_DB_URL (or other TGC_*) of the caller's shell must not leak in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TGC_")}
        env.update(self.env, PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"control plane exited with {self.proc.returncode}; see {self.log_path}:\n"
                    + self.log_tail()
                )
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop(kill=True)
        raise RuntimeError(f"control plane did not answer within {timeout_s}s; see {self.log_path}")

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Until /readyz says the database and Ray are reachable (a managed Ray head takes a while)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"control plane not ready after {timeout_s}s:\n{self.log_tail()}")

    def stop(self, kill: bool = False, timeout_s: float = 30.0) -> None:
        """SIGTERM (graceful) or SIGKILL (a crash) the server process; the Ray head it manages lives on."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def create_token(
        self, tenant: str, admin: bool = False, max_concurrent: int | None = None, db_url: str | None = None
    ) -> str:
        """Mint a token directly in this server's database (what `tgc token create` does)."""
        engine = make_engine(db_url or f"sqlite:///{(self.data_dir / 'tgc.db').resolve()}")
        try:
            migrate(engine)
            store = TokenStore(engine)
            _, secret = store.create(tenant, is_admin=admin)
            if max_concurrent is not None:
                store.set_quota(tenant, max_concurrent)
            return secret
        finally:
            engine.dispose()

    def __enter__(self) -> LocalControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
