"""The client distribution (clients/): the SDK and the CLI's remote commands without torch, Ray or the server.

The fast test checks the SDK's imports in this environment; the install test builds the client wheel from the
modules clients/pyproject.toml names, installs it into a fresh venv (its dependencies from the configured
indexes) and drives a real control plane on loopback with it, through the SDK and through `tgc`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = tomllib.loads((ROOT / "clients" / "pyproject.toml").read_text())
# What a client must not load: the engines, the server's stack, and our own server/trainer/spec modules.
HEAVY = (
    "torch",
    "ray",
    "vllm",
    "transformers",
    "numba",
    "numpy",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "rlcore",
    "tgc_rl.config",
    "tgc_rl.control",
    "tgc_rl.trainer",
    "tgc_rl.tasks",
)


def _loaded_after(code: str, python: str = sys.executable, **kw) -> list[str]:
    probe = f"{code}\nimport sys, json; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True, timeout=120, **kw)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_sdk_imports_nothing_of_the_server_the_trainer_or_the_spec():
    assert _loaded_after("import tgc_rl.sdk; from tgc_rl.sdk import Client, Job, TraceRecord") == []


def test_the_cli_parses_a_remote_command_without_the_trainer_or_the_tasks():
    # `tgc train`'s arguments come from the trainer and `data export`'s task list from the tasks: built for those
    # commands only, so every other command starts without them (here, with the full install)
    code = "from tgc_rl.cli import main\ntry:\n    main(['submit', '--help'])\nexcept SystemExit:\n    pass"
    assert _loaded_after(code) == []
    assert "tgc_rl.trainer" in _loaded_after(code.replace("submit", "train"))  # the probe sees them


def _client_sources(dest: Path) -> Path:
    """The client's project folder with only the modules it names (what a build from a clean tree sees)."""
    shutil.copytree(ROOT / "clients", dest / "clients", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")  # the version
    for module in CLIENT["tool"]["tgc-client"]["modules"]:
        (dest / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / module, dest / module)
    return dest / "clients"


_NETWORK = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "No matching distribution found",
    "Could not find a version",
)

# Runs in the fresh venv: the SDK and the CLI entry, a submitted and listed job, nothing heavy loaded.
_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    from tgc_rl.sdk import Client
    from tgc_rl.cli import main
    url, token = sys.argv[1], sys.argv[2]
    with Client(url, token) as client:
        job = client.submit({"name": "client-only", "steps": 2, "group_size": 2, "prompts_per_step": 2})
        listed = [j.id for j in client.jobs()]
        cancelled = job.cancel("from the client install").state.value
    code = main(["status", job.id, "--url", url, "--token", token, "--json"])
    installed = [m for m in ("torch", "ray", "fastapi", "sqlalchemy", "rlcore") if importlib.util.find_spec(m)]
    print(json.dumps({"job": job.id, "listed": listed, "cancelled": cancelled, "status_exit": code,
                      "installed": installed}))
    """
)


@pytest.mark.slow
def test_the_client_wheel_installs_alone_and_drives_a_control_plane(api_server, tmp_path):
    project = _client_sources(tmp_path / "src")
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-q",
            "-w",
            str(dist),
            str(project),
        ],
        check=True,
        timeout=120,
    )
    (wheel,) = dist.glob("tgc_rl_client-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    # The dependencies at the versions this environment tested (pip's own constraints apply too).
    pins = tmp_path / "pins.txt"
    pins.write_text("".join(f"{d}=={metadata.version(d)}\n" for d in ("httpx", "pydantic", "pyyaml", "rich")))
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--retries",
            "1",
            "--timeout",
            "20",
            "-c",
            str(pins),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if install.returncode != 0 and any(s in install.stderr for s in _NETWORK):
        pytest.skip(f"the client's dependencies are not reachable from here: {install.stderr.strip()[-300:]}")
    assert install.returncode == 0, install.stderr

    script = tmp_path / "client.py"
    script.write_text(_SCRIPT)
    out = subprocess.run(
        [python, str(script), api_server.url, api_server.acme],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["job"] in seen["listed"] and seen["cancelled"] == "cancelled" and seen["status_exit"] == 0
    assert seen["installed"] == []  # not even installed: the client's dependency closure is light
    assert (
        _loaded_after(
            f"import sys; sys.argv = ['x', {api_server.url!r}, {api_server.acme!r}]; "
            f"exec(open({str(script)!r}).read())",
            python,
            cwd=tmp_path,
        )
        == []
    )

    # `tgc` itself: a remote command answers; a local one names the install it needs
    tgc = str(venv / "bin" / "tgc")
    jobs = subprocess.run(
        [tgc, "jobs", "--url", api_server.url, "--token", api_server.acme, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert jobs.returncode == 0 and seen["job"] in {j["id"] for j in json.loads(jobs.stdout)}, jobs.stderr
    train = subprocess.run([tgc, "train", "job.yaml"], capture_output=True, text=True, timeout=60)
    assert train.returncode == 2 and "pip install tgc-rl" in train.stderr, train.stderr
    schema = subprocess.run(
        [tgc, "schema", "--remote", "--url", api_server.url, "--token", api_server.acme],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert schema.returncode == 0 and "objective" in json.loads(schema.stdout)["properties"], schema.stderr
    local = subprocess.run([tgc, "schema"], capture_output=True, text=True, timeout=60)
    assert local.returncode == 2 and "--remote" in local.stderr, local.stderr
