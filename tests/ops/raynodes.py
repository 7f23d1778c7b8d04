"""Real Ray nodes for the ops tests: `ray start` heads and workers on loopback, each in a session of its own
(every daemon and worker of a node is found by that session and killed by pid), with Ray token auth on."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import psutil

from tgc_rl.control.ray_cluster import _free_ports

RAY = str(Path(sys.executable).with_name("ray"))


def ray_env(token_file: Path, **extra: str) -> dict[str, str]:
    """Environment of a Ray node or driver of these clusters: token auth with this token, no TGC_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGC_", "RAY_"))}
    env.update(
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token_file),
        RAY_metrics_report_interval_ms="1000",
        **extra,
    )
    return env


class RayNode:
    """One `ray start` node; `kill()` is a node lost at once (SIGKILL to all its processes)."""

    def __init__(
        self,
        root: Path,
        name: str,
        token_file: Path,
        *,
        head_address: str | None = None,
        num_cpus: float = 2,
        resources: dict[str, float] | None = None,
    ):
        self.name, self.token_file = name, token_file
        self.temp_dir = Path("/tmp") / f"tgc-ops-{secrets.token_hex(4)}"  # Ray's socket paths must stay short
        ports = _free_ports(9)
        self.gcs_port, self.dashboard_port, self.metrics_port = ports[0], ports[1], ports[2]
        cmd = [
            RAY,
            "start",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            f"--metrics-export-port={self.metrics_port}",
            f"--node-manager-port={ports[3]}",
            f"--object-manager-port={ports[4]}",
            f"--dashboard-agent-listen-port={ports[5]}",
            f"--dashboard-agent-grpc-port={ports[6]}",
            f"--runtime-env-agent-port={ports[7]}",
            "--object-store-memory=200000000",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]
        if resources:
            cmd.append(f"--resources={json.dumps(resources)}")
        if head_address is None:
            cmd += [
                "--head",
                f"--port={self.gcs_port}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={ports[8]}",
            ]
        else:
            cmd.append(f"--address={head_address}")
        self.log = root / f"ray-{name}.log"
        with open(self.log, "w") as log:
            proc = subprocess.Popen(
                cmd, env=ray_env(token_file), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.session = proc.pid
        try:
            rc = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
        if rc != 0:
            self.kill()
            raise RuntimeError(f"ray start ({name}) exited with {rc}:\n{self.log.read_text()[-3000:]}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def processes(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getsid(p.pid) == self.session or any(str(self.temp_dir) in a for a in p.cmdline()):
                    found[p.pid] = p
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                continue
        for p in list(found.values()):
            try:
                found.update({c.pid: c for c in p.children(recursive=True)})
            except psutil.NoSuchProcess:
                continue
        found.pop(os.getpid(), None)
        return list(found.values())

    def kill(self) -> None:
        procs = self.processes()
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)

    def stop(self) -> None:
        self.kill()
        import shutil

        shutil.rmtree(self.temp_dir, ignore_errors=True)


def state_api(dashboard_url: str, token_file: Path, resource: str, **filters: str) -> list[dict]:
    """Ray's state API over HTTP (what `ray list actors --detail` reads): actors, nodes, placement_groups."""
    params = [("detail", "1"), ("limit", "1000")]
    params += [("filter_keys", k) for k in filters] + [("filter_predicates", "=") for _ in filters]
    params += [("filter_values", v) for v in filters.values()]
    r = httpx.get(
        f"{dashboard_url}/api/v0/{resource}",
        params=params,
        timeout=30,
        headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
    )
    r.raise_for_status()
    return r.json()["data"]["result"]["result"]


def make_token(path: Path) -> Path:
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path
