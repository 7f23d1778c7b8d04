"""A local Ray head the control plane starts and owns (`ray_address: local`).

It is started with `ray start --head` as daemons in their own session, so it outlives a restart of the
control plane (whose running jobs must survive it); its address is kept in `<data_dir>/ray/cluster.json`
and reused while it answers. It gets its own temp dir and explicit free ports, so it never collides
with (or is picked up by `ray.init()` of) other Ray clusters on the same machine. It runs with Ray's
token authentication on, using its own token (`<data_dir>/ray/auth_token`, mode 0600): the dashboard
and Jobs API accept arbitrary code, and the machine may be shared.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

_PORT_FLAGS = (
    "--port",
    "--dashboard-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
    "--node-manager-port",
    "--object-manager-port",
    "--ray-client-server-port",
)


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _ray_executable() -> list[str]:
    exe = Path(sys.executable).with_name("ray")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


class LocalRayCluster:
    def __init__(self, data_dir: Path, num_cpus: int = 8, object_store_bytes: int = 512 * 2**20):
        self.root = Path(data_dir).resolve() / "ray"
        self.num_cpus = num_cpus
        self.object_store_bytes = object_store_bytes
        # Short and unique per data dir: Ray's unix sockets live below it (108-byte path limit).
        tag = hashlib.sha1(str(self.root).encode()).hexdigest()[:10]
        self.temp_dir = Path("/tmp") / f"tgc-ray-{tag}"
        self.state_file = self.root / "cluster.json"
        self.token_file = self.root / "auth_token"

    @property
    def token(self) -> str:
        """This head's Ray auth token (created on first use)."""
        if not self.token_file.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        return self.token_file.read_text().strip()

    # -- state --------------------------------------------------------------------------------------
    def _saved(self) -> dict | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def _answers(self, dashboard_url: str) -> bool:
        try:
            headers = {"Authorization": f"Bearer {self.token}"}
            return httpx.get(f"{dashboard_url}/api/jobs/", headers=headers, timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def dashboard_url(self) -> str | None:
        saved = self._saved()
        return saved["dashboard_url"] if saved else None

    @property
    def gcs_address(self) -> str | None:
        saved = self._saved()
        return saved["gcs_address"] if saved else None

    def running(self) -> bool:
        url = self.dashboard_url
        return url is not None and self._answers(url)

    # -- lifecycle ----------------------------------------------------------------------------------
    def ensure(self, timeout_s: float = 240.0) -> str:
        """The dashboard URL of the running head, starting one if none answers."""
        url = self.dashboard_url
        if url and self._answers(url):
            return url
        if url:
            self.stop()  # a half-dead head from before: clear it out before starting anew
        last_error = ""
        for _ in range(3):  # a port picked as free may be taken before Ray binds it: retry
            try:
                return self._start(timeout_s)
            except RuntimeError as e:
                last_error = str(e)
                log.warning("starting the local Ray head failed, retrying: %s", e)
                self.stop()
        raise RuntimeError(f"could not start a local Ray head: {last_error}")

    def _start(self, timeout_s: float) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
        cmd = [
            *_ray_executable(),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            f"--object-store-memory={self.object_store_bytes}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            *(f"{flag}={port}" for flag, port in ports.items()),
        ]
        # Jobs inherit this environment: none of the control plane's own settings (database URL and
        # password, tokens) may reach the code that runs on the cluster.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TGC_")}
        env.update(
            RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file)
        )
        _ = self.token  # make sure it exists before the head reads it
        for var in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
            env.pop(var, None)
        log.info("starting a local Ray head: %s", " ".join(cmd))
        # Own session: a Ctrl-C of `tgc serve` must not take the cluster (and its running jobs) down.
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"`ray start` exited with {proc.returncode}: {stderr[-2000:]}")
        url = f"http://127.0.0.1:{ports['--dashboard-port']}"
        # every daemon of the head lives in the session `ray start` led: stop() finds them all by it
        state = {
            "dashboard_url": url,
            "gcs_address": f"127.0.0.1:{ports['--port']}",
            "temp_dir": str(self.temp_dir),
            "session": proc.pid,
        }
        self.state_file.write_text(json.dumps(state))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._answers(url):
                return url
            time.sleep(1.0)
        raise RuntimeError(f"the Ray dashboard at {url} did not answer within {timeout_s:.0f}s")

    def core_processes(self) -> list:
        """The head's own daemons (GCS, raylet, dashboard...): those whose command line names its temp dir.
        None left means the head is gone, whatever helpers of it linger."""
        import psutil

        marker = str(self.temp_dir)
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(marker in part for part in (p.info["cmdline"] or [])):
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def processes(self) -> list:
        """Every process of this head: its core daemons and every other process of their session (`ray start`
        ran in a session of its own; its client-server proxy names no temp dir and outlives the head)."""
        import psutil

        found = self.core_processes()
        sessions = {(self._saved() or {}).get("session")} - {None}
        for p in found:
            try:
                sessions.add(os.getsid(p.pid))
            except ProcessLookupError:
                continue
        sessions.discard(os.getsid(0))  # never our own session
        if sessions:
            seen = {p.pid for p in found}
            for p in psutil.process_iter(["pid"]):
                try:
                    if p.pid not in seen and os.getsid(p.pid) in sessions:
                        found.append(p)
                except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                    continue
        return found

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate this head's processes (and their children, e.g. job drivers), by pid; remove its temp dir."""
        import psutil

        procs = self.processes()
        victims = {p.pid: p for p in procs}
        for p in procs:
            try:
                for child in p.children(recursive=True):
                    victims.setdefault(child.pid, child)
            except psutil.NoSuchProcess:
                continue
        victims.pop(os.getpid(), None)
        for p in victims.values():
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(list(victims.values()), timeout=timeout_s)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        try:
            self.state_file.unlink()
        except OSError:
            pass  # the token file stays: a restarted head keeps the same token
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # the session's sockets and logs (in /tmp)
