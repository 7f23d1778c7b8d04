import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.proc_helpers import local_ray
from tests.specs import job_spec, tiny_model
from tgc_rl.config import JobSpec

TINY_MODEL = tiny_model(max_position_embeddings=512)


BASE = {
    "name": "tiny",
    "model": TINY_MODEL,
    "task": {"name": "arithmetic", "reward_workers": 1, "reward": "tests.trainer.rewards:text_parity"},
    "objective": {"name": "cp_grpo"},
    "group_size": 4,
    "prompts_per_step": 2,
    "steps": 3,
    "seed": 0,
    "sampling": {"max_new_tokens": 8, "max_prompt_tokens": 128},
    "optim": {"lr": 1e-3, "micro_batch_size": 4},
    "resources": {"rollout_engine": "hf", "cpus_per_learner": 0.5, "cpus_per_rollout": 0.5},
    "checkpoint": {"every_steps": 1, "keep_last": 5},
}


def tiny_spec(**changes):
    return job_spec(BASE, **changes)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln]


def read_events(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines() if ln]


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for all trainer modules (each runs whole jobs; the trainer reuses an initialised Ray)."""
    yield from local_ray()


def kill_trainer_after_checkpoint(
    spec: JobSpec, run_dir: Path, checkpoint: str, timeout: float = 900
) -> None:
    """Run `spec` as `tgc train` does (a subprocess with its own local Ray) and hard-kill its process group once
    `checkpoints/<checkpoint>` exists, i.e. during the next step: SIGKILL, no handler, no final checkpoint.
    Returns once none of its processes is left (asserted within 30 s)."""
    import psutil

    spec_file = run_dir.with_name(f"{run_dir.name}.yaml")
    spec_file.write_text(spec.to_yaml())
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local Ray, as `tgc train`
    proc = subprocess.Popen(
        [sys.executable, "-m", "tgc_rl.trainer", "--spec", str(spec_file), "--run-dir", str(run_dir)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while not (run_dir / "checkpoints" / checkpoint).exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"the trainer ended before {checkpoint}"
            )
            time.sleep(0.1)
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    gone = time.monotonic() + 30
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in family):
        assert time.monotonic() < gone, "processes of the killed trainer outlived it"
        time.sleep(0.2)
