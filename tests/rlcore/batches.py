"""Random batches for rlcore tests: groups of responses with shared prefixes and off-policy log-probs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    mask: torch.Tensor
    token_ids: torch.Tensor
    prefix: torch.Tensor  # (n_groups,) length of the identical prefix built into each group
    group_size: int


def make_batch(
    seed: int,
    n_groups: int = 3,
    group_size: int = 4,
    width: int = 8,
    *,
    off_policy: float = 0.3,
    binary: bool = True,
    shared_prefix: bool = True,
    dtype: torch.dtype = torch.float64,
) -> Batch:
    """Groups whose responses share an identical prefix (same tokens => same log-probs there, as a real
    model gives identical contexts), random continuations, lengths and rewards (never all equal)."""
    g = torch.Generator().manual_seed(seed)
    batch = n_groups * group_size
    group_ids = torch.arange(batch) // group_size * 7 + 3  # arbitrary, non-contiguous ids
    lengths = torch.randint(1, width + 1, (batch,), generator=g)
    prefix = torch.zeros(n_groups, dtype=torch.long)
    if shared_prefix:
        min_len = lengths.view(n_groups, group_size).min(1).values
        prefix = torch.stack([torch.randint(1, int(m) + 1, (1,), generator=g)[0] for m in min_len])
    tokens = torch.randint(0, 5, (batch, width), generator=g)
    old = -torch.rand(batch, width, generator=g, dtype=dtype) * 3
    lp = old + off_policy * torch.randn(batch, width, generator=g, dtype=dtype)
    ref = old + 0.3 * torch.randn(batch, width, generator=g, dtype=dtype)
    for k in range(n_groups):
        rows = slice(k * group_size, (k + 1) * group_size)
        m = int(prefix[k])
        for x in (tokens, old, lp, ref):
            x[rows, :m] = x[k * group_size, :m]
        # force divergence right after the prefix so it is the *longest* common prefix
        if m < width:
            tokens[rows, m] = torch.arange(group_size) % 5
            if group_size > 5:
                tokens[rows, m] = torch.arange(group_size) + 10
    mask = torch.arange(width)[None, :] < lengths[:, None]
    if binary:
        rewards = (torch.rand(batch, generator=g) < 0.5).to(dtype)
    else:
        rewards = torch.randn(batch, generator=g, dtype=dtype)
    rewards = rewards.view(n_groups, group_size)
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # never an all-equal group
    return Batch(lp, old, ref, rewards.flatten(), group_ids, mask, tokens, prefix, group_size)
