"""Fixtures of the learner tests: a tiny random-init Llama (SmolLM2 tokenizer, head size 64) and its specs
(synthetic batches: the `make_batch` fixture of tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.specs import job_spec

TINY_MODEL = {
    "source": "random",
    "dtype": "float32",
    "config_overrides": {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
}


BASE = {
    "name": "learner-test",
    "model": TINY_MODEL,
    "objective": {"name": "cp_grpo"},
    "group_size": 4,
    "prompts_per_step": 4,
    "steps": 10,
    "sampling": {"max_new_tokens": 12},
    "optim": {"lr": 1e-3, "micro_batch_size": 16, "logprob_chunk_tokens": 16},
    "resources": {"cpus_per_learner": 1},
}


def build_spec(**changes):
    """A JobSpec for the tiny model; `changes` use dotted keys, e.g. tiny_spec(**{"optim.lr": 1e-3})."""
    return job_spec(BASE, **changes)


@pytest.fixture(scope="session")
def tiny_model_path():
    from tgc_rl.config import ModelSpec
    from tgc_rl.models import model_dir

    # Built before any process group exists: save_pretrained writes nothing on ranks != 0.
    return model_dir(ModelSpec(**TINY_MODEL), seed=0)


@pytest.fixture(scope="session")
def tiny_spec():
    """Factory: tiny_spec(**{"optim.lr": 1e-3}) -> JobSpec of the tiny model."""
    return build_spec


@pytest.fixture(scope="session")
def learner_spec():
    """Factory: learner_spec(**{"optim.lr": 1e-3}) -> the LearnerSpec a rank of that tiny job gets."""
    from tgc_rl.learner import LearnerSpec

    return lambda **changes: LearnerSpec.of(build_spec(**changes))
