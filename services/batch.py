"""The data that flows between rollout, trainer and learner in one step (plain tensors, no Ray)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Completion:
    """One sampled response, as the rollout engine returns it."""

    token_ids: list[int]
    logprobs: list[float]  # sampling log-prob of each token under the generating policy
    finish_reason: str  # "stop" (EOS) or "length" (hit max_new_tokens)
    version: int  # policy version of the weights that generated it


@dataclass
class TrainBatch:
    """All sequences of one optimizer step. Prompts are left-padded to `prompt_len` columns, responses
    right-padded after them, so response position t of every row is column prompt_len + t."""

    input_ids: torch.Tensor  # (B, P+T) long
    attention_mask: torch.Tensor  # (B, P+T) long, 0 on padding
    response_mask: torch.Tensor  # (B, T) float, 1 on response tokens
    advantages: torch.Tensor  # (B,) or (B, T) float, from rlcore
    group_ids: torch.Tensor  # (B,) long; the G rows of a group are contiguous
    rollout_logprobs: torch.Tensor  # (B, T) float, 0 off the mask
    rewards: torch.Tensor  # (B,) float
    versions: torch.Tensor  # (B,) long, policy version of each sample
    prompt_len: int
    meta: dict = field(default_factory=dict)

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len :]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor | list[int]) -> TrainBatch:
        rows = torch.as_tensor(rows, dtype=torch.long)
        pick = lambda t: t.index_select(0, rows)  # noqa: E731
        return TrainBatch(
            pick(self.input_ids),
            pick(self.attention_mask),
            pick(self.response_mask),
            pick(self.advantages),
            pick(self.group_ids),
            pick(self.rollout_logprobs),
            pick(self.rewards),
            pick(self.versions),
            self.prompt_len,
            dict(self.meta),
        )


def collate(
    prompts: list[list[int]],
    completions: list[Completion],
    group_ids: list[int],
    advantages: torch.Tensor,
    rewards: torch.Tensor,
    pad_id: int,
) -> TrainBatch:
    """Build a TrainBatch from row-aligned prompts and completions (left-pad prompts, right-pad responses)."""
    if not (len(prompts) == len(completions) == len(group_ids) == rewards.shape[0]):
        raise ValueError("collate: prompts, completions, group_ids and rewards must have one entry per row")
    P = max(len(p) for p in prompts)
    T = max(1, max(len(c.token_ids) for c in completions))
    B = len(prompts)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    rmask = torch.zeros((B, T), dtype=torch.float32)
    rlp = torch.zeros((B, T), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        n = len(c.token_ids)
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P + n] = 1
        if n:
            ids[i, P : P + n] = torch.tensor(c.token_ids, dtype=torch.long)
            rmask[i, :n] = 1.0
            rlp[i, :n] = torch.tensor(c.logprobs, dtype=torch.float32)
    versions = torch.tensor([c.version for c in completions], dtype=torch.long)
    return TrainBatch(
        ids, attn, rmask, advantages, torch.tensor(group_ids, dtype=torch.long), rlp, rewards, versions, P
    )
