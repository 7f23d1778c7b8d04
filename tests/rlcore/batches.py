"""Random batches for rlcore tests: groups of responses with shared prefixes and off-policy log-probs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


@dataclass
class MultiTurn:
    """Multi-turn trajectories in the layout the trainer gives the learner (tgc_rl.batch.collate of
    `Completion.from_segments`): `batch.response_mask` has holes where observations sit."""

    batch: Any  # tgc_rl.batch.SampledBatch
    logprobs: torch.Tensor  # (B, T) current-policy log-probs, a function of the history (0 off the mask)
    turns: torch.Tensor  # (B, T) long: the model turn of each model token, -1 elsewhere
    first_turn_len: int  # model tokens of the group-common first tool call


def tool(call: list[int]) -> list[int]:
    """A deterministic tool and the template tokens an environment wraps its output in: the same call gives
    the same observation, token for token."""
    return [901, sum(call) % 97 + 300, len(call) + 400, 902, 903]


def _history_logprob(history: list[int], token: int, salt: int) -> float:
    """A log-prob that depends on the whole history and the token only, as a model's does: copies of a
    shared node get bit-identical values (ints hash deterministically)."""
    return -0.05 - 3.0 * (hash((salt, *history, token)) % 10_007) / 10_007


class _Trajectory:
    """One trajectory being built: its history, segments, the turn of each token and current log-probs."""

    def __init__(self, prompt: list[int], off_policy: bool):
        from tgc_rl.batch import Segment

        self.segment = Segment
        self.history, self.off_policy = prompt, off_policy
        self.segments: list[Any] = []
        self.turns: list[int] = []
        self.logprobs: list[float] = []

    def model(self, tokens: list[int], turn: int) -> None:
        old = []
        for t in tokens:
            old.append(_history_logprob(self.history, t, 0))
            shift = 0.1 * (_history_logprob(self.history, t, 1) + 1.5) if self.off_policy else 0.0
            self.logprobs.append(old[-1] + shift)
            self.history.append(t)
        self.segments.append(self.segment(tokens, old))
        self.turns.extend([turn] * len(tokens))

    def observe(self, tokens: list[int]) -> None:
        self.segments.append(self.segment(tokens))
        self.history.extend(tokens)
        self.turns.extend([-1] * len(tokens))
        self.logprobs.extend([0.0] * len(tokens))


def multi_turn_batch(seed: int, n_groups: int = 3, group_size: int = 4, off_policy: bool = True) -> MultiTurn:
    """Groups whose trajectories open with the same tool call (so the same deterministic tool output: a
    group-common prefix that runs through an observation), then one of two second calls, one extending the
    other (partial shared nodes past an observation, in turns of unequal length), 1-3 tool turns, a final
    answer (one trajectory per group ends on an observation instead: cut off by a deadline), ragged lengths,
    binary rewards."""
    from tgc_rl.batch import Completion, collate

    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(10, 200, (n,), generator=gen).tolist()

    prompts, comps, gids, rewards, turn_rows, lp_rows = [], [], [], [], [], []
    first_len = 4
    for g in range(n_groups):
        prompt = rand(int(torch.randint(3, 7, (1,), generator=gen)))
        first_call = rand(first_len)
        second = rand(int(torch.randint(1, 4, (1,), generator=gen)))
        second = [second, second + rand(2)]  # one extends the other: shared nodes in turns of unequal length
        for i in range(group_size):
            traj = _Trajectory(list(prompt), off_policy)
            # 1-3 tool calls; siblings of one parity share their second call and its output
            calls = [first_call, second[i % 2], rand(2)][: 1 + (i + g) % 3]
            for k, call in enumerate(calls):
                traj.model(call, k)
                traj.observe(tool(call))
            if i != group_size - 1:  # the last sibling hits its deadline after an observation
                traj.model([i + 5, *rand(int(torch.randint(0, 4, (1,), generator=gen)))], len(calls))
            prompts.append(prompt)
            comps.append(Completion.from_segments(traj.segments, "stop", 0))
            gids.append(g)
            rewards.append(float(i % 2) if i < 2 else float(torch.randint(0, 2, (1,), generator=gen)))
            turn_rows.append(traj.turns)
            lp_rows.append(traj.logprobs)
    batch = collate(prompts, comps, gids, torch.tensor(rewards, dtype=torch.float64), pad_id=2)
    T = batch.response_mask.shape[1]
    turns_t = torch.full((len(comps), T), -1, dtype=torch.long)
    lp_t = torch.zeros(len(comps), T, dtype=torch.float64)
    for i, (tr, lp) in enumerate(zip(turn_rows, lp_rows, strict=True)):
        turns_t[i, : len(tr)] = torch.tensor(tr)
        lp_t[i, : len(lp)] = torch.tensor(lp, dtype=torch.float64)
    batch.rollout_logprobs = batch.rollout_logprobs.to(torch.float64)
    # collate keeps float32 engine log-probs; recompute them in float64 so copies compare exactly
    for i, c in enumerate(comps):
        n = len(c.token_ids)
        batch.rollout_logprobs[i, :n] = torch.tensor(c.logprobs, dtype=torch.float64)
    return MultiTurn(batch, lp_t, turns_t, first_len)
