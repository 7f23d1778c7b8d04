"""Shared fixtures of the learner tests: a tiny random-init Llama (SmolLM2 tokenizer, head size 64) and
synthetic rollout batches with the layout the trainer builds (services.batch.collate)."""

from __future__ import annotations

import copy

import pytest
import torch

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


def build_spec(**changes):
    """A JobSpec for the tiny model; `changes` use dotted keys, e.g. tiny_spec(**{"optim.lr": 1e-3})."""
    from services.config import JobSpec

    data = {
        "name": "learner-test",
        "model": copy.deepcopy(TINY_MODEL),  # changes below must not leak into later tests' specs
        "objective": {"name": "cp_grpo"},
        "group_size": 4,
        "prompts_per_step": 4,
        "steps": 10,
        "sampling": {"max_new_tokens": 12},
        "optim": {"lr": 1e-3, "micro_batch_size": 16, "logprob_chunk_tokens": 16},
        "resources": {"cpus_per_learner": 1},
    }
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return JobSpec.parse(data)


def build_batch(
    n_groups: int = 4,
    group_size: int = 4,
    seed: int = 0,
    vocab: int = 2000,
    common_prefix: int = 3,
    objective: str = "cp_grpo",
    max_prompt: int = 9,
    max_response: int = 12,
):
    """Groups of `group_size` responses to random prompts of different lengths (left padding); the responses
    of a group share their first `common_prefix` tokens (a group-common node) and differ in length;
    binary rewards with at least one success and one failure per group; advantages from rlcore."""
    import rlcore
    from services.batch import Completion, collate

    gen = torch.Generator().manual_seed(seed)
    prompts, comps, gids, rewards = [], [], [], []
    for g in range(n_groups):
        plen = int(torch.randint(3, max_prompt + 1, (1,), generator=gen))
        prompt = torch.randint(3, vocab, (plen,), generator=gen).tolist()
        prefix = torch.randint(3, vocab, (common_prefix,), generator=gen).tolist()
        for i in range(group_size):
            n = int(torch.randint(common_prefix + 1, max_response + 1, (1,), generator=gen))
            tokens = prefix + torch.randint(3, vocab, (n - common_prefix,), generator=gen).tolist()
            logprobs = (-torch.rand(n, generator=gen) * 3).tolist()
            prompts.append(prompt)
            comps.append(Completion(tokens, logprobs, "stop", 0))
            gids.append(g)
            rewards.append(float(i % 2 if i < 2 else torch.randint(0, 2, (1,), generator=gen)))
    reward_t = torch.tensor(rewards)
    batch = collate(prompts, comps, gids, torch.zeros(len(rewards)), reward_t, pad_id=2)
    batch.advantages = rlcore.get_objective(objective).advantages(
        reward_t, batch.group_ids, batch.response_mask
    )
    return batch


@pytest.fixture(scope="session")
def tiny_model_path():
    from services.config import ModelSpec
    from services.models import model_dir

    # Built before any process group exists: save_pretrained writes nothing on ranks != 0.
    return model_dir(ModelSpec(**TINY_MODEL), seed=0)


@pytest.fixture(scope="session")
def tiny_spec():
    """Factory: tiny_spec(**{"optim.lr": 1e-3}) -> JobSpec of the tiny model."""
    return build_spec


@pytest.fixture(scope="session")
def make_batch():
    """Factory: make_batch(n_groups=4, group_size=4, seed=0, objective="cp_grpo", ...) -> TrainBatch."""
    return build_batch
