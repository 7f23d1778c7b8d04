"""The embedded default learns: SmolLM2-135M-Instruct on 1-digit addition with cp_grpo, through the real
stack (local Ray, vLLM CPU engine, FSDP2 learner, reward pool). Seeded; a shortened run of examples/default."""

import pytest

from tgc_rl.config import JobSpec
from tgc_rl.trainer.main import run

from .conftest import read_metrics

pytestmark = pytest.mark.slow


# A step takes ~20-35 s on an AVX2-only 2-core machine (float32; generation ~12-15 s, the learner's step ~7-17 s)
# and about twice that beside another test. The reward rises from the first update on: the first two steps
# against the last two of 4 (measured there, seed 0: 0.20, 0.42 | 0.61, 0.52; benchmarks/learning_seeds.py).
@pytest.mark.timeout(2400)
def test_default_job_raises_reward(ray_cluster, tmp_path):
    spec = JobSpec.from_yaml("examples/default.yaml")
    spec.steps = 4
    spec.checkpoint.every_steps = 0
    spec.checkpoint.save_optimizer = (
        False  # the final save: 0.5 GB of weights instead of 2 GB with AdamW's moments
    )
    spec.task.reward_workers = 1  # learner 1 + rollout 1 + reward 1 CPU of the fixture's 4; sync mode lets
    # the learner and the engine each use both of the job's CPUs in turn (resources.threads_per_actor)
    assert run(spec, tmp_path) == "succeeded"
    rewards = [r["reward/mean"] for r in read_metrics(tmp_path)]
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.1, rewards
