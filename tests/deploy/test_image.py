"""The image, for real: built by scripts/build-image.sh from a Debian-built base (no registry is needed),
started as the control plane on loopback, given a job over REST: the tiny example with the code task, whose
bubblewrap sandbox runs inside the container with only the options the chart gives the Ray workers."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from tests.image_build import ENGINE, ROOT, TAG, build_image
from tgc_rl.control.local import free_port
from tgc_rl.sdk import Client

CACHE = Path(os.environ.get("TGC_CACHE_DIR", Path.home() / ".cache" / "tgc-rl"))

pytestmark = [
    pytest.mark.slow,
    # A first build on a new machine fills the wheelhouse (~1.1 GB of downloads) and builds every stage.
    pytest.mark.timeout(2400),
    pytest.mark.skipif(
        not ENGINE,
        reason="no container engine (podman or docker); scripts/setup.sh installs "
        "Debian's podman where apt can run",
    ),
]


def _engine_env() -> dict[str, str]:
    env = dict(os.environ)
    conf = CACHE / "containers.conf"  # written by scripts/build-image.sh for podman
    if ENGINE == "podman" and "CONTAINERS_CONF" not in env and conf.exists():
        env["CONTAINERS_CONF"] = str(conf)
    return env


def engine(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ENGINE, *args], capture_output=True, text=True, timeout=timeout, check=check, env=_engine_env()
    )


def sandbox_options() -> list[str]:
    """What the chart's sandbox securityContext grants, in this engine's words (deploy/README.md)."""
    if ENGINE == "podman":
        return ["--security-opt", "unmask=/proc/*", "--security-opt", "seccomp=unconfined"]
    return [
        "--security-opt",
        "systempaths=unconfined",
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "apparmor=unconfined",
    ]


@pytest.fixture(scope="module")
def image() -> str:
    build = build_image(
        timeout=1800
    )  # started in the background when collection ended (tests/image_build.py)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-5000:]
    summary = re.search(r"built \S+ in \d+ s; image size \d+ MB", build.stderr)
    assert summary, build.stderr[-2000:]
    print(summary.group(0))
    return TAG


@pytest.fixture(scope="module")
def container(image: str):
    name = f"tgc-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    engine(
        "run",
        "-d",
        "--name",
        name,
        "-p",
        f"127.0.0.1:{port}:8080",
        "--shm-size",
        "1g",
        "-e",
        "TGC_RAY_NUM_CPUS=4",
        *sandbox_options(),
        image,
    )
    try:
        yield name, f"http://127.0.0.1:{port}"
    finally:
        logs = engine("logs", "--tail", "60", name, check=False)
        print(logs.stdout[-4000:], logs.stderr[-4000:])
        engine("rm", "-f", "-v", "-t", "5", name, check=False)  # -v: its /data volume too


def _until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{what} not within {timeout_s:.0f} s")


def test_image_runs_as_an_unprivileged_user_with_tini_and_a_healthcheck(image):
    config = yaml.safe_load(engine("image", "inspect", image).stdout)[0]
    cfg = config.get("Config") or config.get("config") or {}
    assert cfg.get("User") == "1000"
    assert cfg.get("Entrypoint") == ["/usr/bin/tini", "--"]
    health = (
        config.get("Healthcheck") or config.get("HealthCheck") or cfg.get("Healthcheck")
    )  # podman | docker
    assert health and "/healthz" in " ".join(health["Test"]), config.keys()
    tools = engine(
        "run",
        "--rm",
        "--entrypoint",
        "sh",
        image,
        "-c",
        "for t in bwrap tini gcc cc; do command -v $t || true; done; id -u",
    ).stdout.split()
    assert tools == ["/usr/bin/bwrap", "/usr/bin/tini", "1000"], tools  # no compiler in the runtime image


def test_control_plane_answers_health_and_readiness(container):
    _, url = container
    _until(lambda: httpx.get(f"{url}/healthz", timeout=5).status_code == 200, 120, "/healthz")
    ready = _until(
        lambda: (r := httpx.get(f"{url}/readyz", timeout=10)).status_code == 200 and r.json(), 300, "/readyz"
    )
    assert ready["checks"] == {"db": "ok", "ray": "ok"}
    if ENGINE == "podman":  # the image's own HEALTHCHECK, run once by hand (no systemd timers here)
        assert engine("healthcheck", "run", container[0], check=False).returncode == 0


def test_sandbox_isolates_code_inside_the_container(container):
    name, _ = container
    probe = (
        "from tgc_rl.sandbox import Sandbox\n"
        "r = Sandbox().run('import os, socket\\n"
        'print(os.getuid(), len(socket.if_nameindex()), sorted(os.listdir("/")))\')\n'
        "print(r.ok, r.stdout.strip())"
    )
    out = engine("exec", name, "python", "-c", probe, timeout=120).stdout.strip()
    ok, uid, interfaces, *_ = out.split(" ", 3)
    assert ok == "True" and uid == "65534", out
    assert interfaces == "1", out  # loopback only: no network
    assert "'data'" not in out and "'home'" not in out, out  # nothing of the container's files


def _token(name: str) -> str:
    return engine("exec", name, "tgc", "token", "create", "--tenant", "ci").stdout.strip()


def test_the_tiny_example_with_the_code_task_succeeds_in_the_container(container):
    """One job, not two (each costs the container's actor start-ups): examples/tiny.yaml with the code task runs
    everything the tiny job does (HF engine, learner, reward pool, checkpoints) plus the sandbox; the tiny
    example itself is accepted by the server in the image as it is."""
    name, url = container
    client = Client(url, _token(name))
    tiny = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    assert client.validate(tiny)["name"] == "tiny"
    code = {
        **tiny,
        "name": "tiny-code",
        "task": {"name": "code", "reward_workers": 1},
        "sampling": {"max_new_tokens": 16},
        "steps": 2,
    }
    job = client.submit(code).wait(timeout=600)
    assert job.state == "succeeded", (job.state, job.reason, job.driver_log()[-3000:])
    assert [p.step for p in job.metrics()] == [1, 2]
    assert [c.step for c in job.checkpoints()][-1] == 2
