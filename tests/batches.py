"""Synthetic rollout batches with the layout the trainer builds (tgc_rl.batch.collate)."""

from __future__ import annotations

import torch

import rlcore
from tgc_rl.batch import Completion, TrainBatch, collate


def build_batch(
    n_groups: int = 4,
    group_size: int = 4,
    seed: int = 0,
    vocab: int = 2000,
    common_prefix: int = 3,
    objective: str = "cp_grpo",
    max_prompt: int = 9,
    max_response: int = 12,
) -> TrainBatch:
    """Groups of `group_size` responses to random prompts of different lengths (left padding); the responses
    of a group share their first `common_prefix` tokens (a group-common node) and differ in length;
    binary rewards with at least one success and one failure per group; advantages from rlcore."""
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
    batch = collate(prompts, comps, gids, reward_t, pad_id=2)
    return batch.with_advantages(
        rlcore.get_objective(objective).advantages(reward_t, batch.group_ids, batch.response_mask)
    )
