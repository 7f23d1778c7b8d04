import json
from pathlib import Path

import pytest

from tests.proc_helpers import local_ray
from tests.specs import job_spec, tiny_model

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
