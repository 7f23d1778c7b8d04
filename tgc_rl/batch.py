"""The data that flows between rollout, trainer and learner in one step (plain tensors, no Ray).

batch = collate(prompts, completions, group_ids, rewards, pad_id)    # SampledBatch: no advantages yet
train = batch.with_advantages(adv)                                   # TrainBatch, checked once, here

A multi-turn trajectory is one response: the model's segments interleaved with observation segments (tool
output, template tokens the environment inserts), built with `Completion.from_segments`. Every token is in
the sequence the learner runs (`attention_mask`, `history_mask`); only the model's are trained on
(`response_mask` has holes) and carry engine log-probs (docs/objectives.md#multi-turn-credit).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Self

import torch
from torch import Tensor


@dataclass(frozen=True)
class Segment:
    """One run of a multi-turn trajectory: the model's tokens with their sampling log-probs, or an
    observation's tokens (logprobs None: the environment wrote them, so they are never trained on)."""

    token_ids: list[int]
    logprobs: list[float] | None = None

    @property
    def from_model(self) -> bool:
        return self.logprobs is not None


@dataclass
class Completion:
    """One sampled response, as the rollout engine returns it (single-turn), or a whole multi-turn
    trajectory after the prompt (`from_segments`)."""

    token_ids: list[int]
    logprobs: list[float]  # sampling log-prob of each token under the generating policy (0.0 off the model's)
    finish_reason: str  # "stop" (EOS) or "length" (hit max_new_tokens); an environment may name its own end
    version: int  # policy version of the weights that generated it
    model_mask: list[bool] | None = None  # per token: the model sampled it; None: every token (single turn)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n:
            raise ValueError(f"Completion.logprobs: {len(self.logprobs)} entries for {n} token_ids")
        if self.model_mask is not None and len(self.model_mask) != n:
            raise ValueError(f"Completion.model_mask: {len(self.model_mask)} entries for {n} token_ids")

    @classmethod
    def from_segments(cls, segments: list[Segment], finish_reason: str, version: int) -> Completion:
        """The trajectory as one response, token for token as the engine saw and sampled it."""
        ids: list[int] = []
        logprobs: list[float] = []
        model: list[bool] = []
        for k, seg in enumerate(segments):
            n = len(seg.token_ids)
            if seg.logprobs is not None and len(seg.logprobs) != n:
                raise ValueError(
                    f"segments[{k}].logprobs: {len(seg.logprobs)} entries for {n} token_ids (one per "
                    "model token; None for an observation)"
                )
            ids += seg.token_ids
            logprobs += seg.logprobs if seg.logprobs is not None else [0.0] * n
            model += [seg.from_model] * n
        return cls(ids, logprobs, finish_reason, version, model_mask=model)


@dataclass
class SampledBatch:
    """The sampled and scored sequences of one step. Prompts are left-padded to `prompt_len` columns,
    responses right-padded after them, so response position t of every row is column prompt_len + t."""

    input_ids: Tensor  # (B, P+T) long
    attention_mask: Tensor  # (B, P+T) long, 0 on padding
    response_mask: Tensor  # (B, T) float, 1 on response tokens
    group_ids: Tensor  # (B,) long; the G rows of a group are contiguous
    rollout_logprobs: Tensor  # (B, T) float, 0 off the mask
    rewards: Tensor  # (B,) float
    versions: Tensor  # (B,) long, policy version of each sample
    prompt_len: int

    @property
    def response_ids(self) -> Tensor:
        return self.input_ids[:, self.prompt_len :]

    @property
    def history_mask(self) -> Tensor:
        """(B, T) the response columns that hold a token, the model's and the observations' (the loss mask
        `response_mask` marks the model's only): shared nodes are found on this history."""
        return self.attention_mask[:, self.prompt_len :]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Tensor | list[int]) -> Self:
        """The batch's `rows`, in that order (every per-row tensor picked alike)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        picked: dict[str, Any] = {
            f.name: value.index_select(0, idx)
            for f in dataclasses.fields(self)
            if isinstance(value := getattr(self, f.name), Tensor)
        }
        return dataclasses.replace(self, **picked)

    def with_advantages(self, advantages: Tensor, credit: Tensor | None = None) -> TrainBatch:
        """The batch the learner trains on. Checked here (`validate_batch`), on the driver, before any learner
        rank sees it: every rank then gets the same valid batch, and no rank refuses it inside a collective."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(SampledBatch)}
        batch = TrainBatch(**fields, advantages=advantages, credit=credit)
        validate_batch(batch)
        return batch


@dataclass
class TrainBatch(SampledBatch):
    """A SampledBatch with its advantages: what the learner's `train_step` takes."""

    advantages: Tensor  # (B,) per response (rlcore), or (B, T) per token; never masked
    credit: Tensor | None = None  # (B, T) coefficient of each token's weight (IBPO's edit mask); None: all 1

    @property
    def loss_advantages(self) -> Tensor:
        """What the loss weights each token by. The diagnostics read `advantages` itself: a token the credit
        mask zeroes is a coefficient of its weight, not an advantage of 0 (rlcore/ibpo.py)."""
        return self.advantages if self.credit is None else self.advantages[:, None] * self.credit


def collate(
    prompts: list[list[int]],
    completions: list[Completion],
    group_ids: list[int],
    rewards: Tensor,
    pad_id: int,
) -> SampledBatch:
    """Build a SampledBatch from row-aligned prompts and completions (left-pad prompts, right-pad responses)."""
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
            model = torch.ones(n) if c.model_mask is None else torch.tensor(c.model_mask, dtype=torch.float32)
            rmask[i, :n] = model
            # the engine gives log-probs for the model's tokens only
            rlp[i, :n] = torch.tensor(c.logprobs, dtype=torch.float32) * model
    versions = torch.tensor([c.version for c in completions], dtype=torch.long)
    return SampledBatch(
        ids, attn, rmask, torch.tensor(group_ids, dtype=torch.long), rlp, rewards, versions, P
    )


def group_bounds(group_ids: Tensor) -> list[tuple[int, int]]:
    """[start, stop) rows of each group, in order; a group id that reappears later is an error."""
    ids = group_ids.tolist()
    bounds: list[tuple[int, int]] = []
    seen: set[int] = set()
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[start]:
            if ids[start] in seen:
                raise ValueError(
                    f"TrainBatch.group_ids: group {ids[start]} is not contiguous; the G rows of a "
                    "group must be adjacent (tgc_rl.batch.collate keeps them so)"
                )
            seen.add(ids[start])
            bounds.append((start, i))
            start = i
    return bounds


def validate_batch(batch: TrainBatch) -> None:
    """Shapes, values and the group layout the learner relies on; ValueError names the field and the fix."""
    B = len(batch)
    if B == 0:
        raise ValueError("TrainBatch is empty: the learner needs at least one group")
    if batch.input_ids.ndim != 2 or batch.attention_mask.shape != batch.input_ids.shape:
        raise ValueError(
            f"TrainBatch.input_ids and attention_mask must both be (B, P+T); got "
            f"{tuple(batch.input_ids.shape)} and {tuple(batch.attention_mask.shape)}"
        )
    T = batch.input_ids.shape[1] - batch.prompt_len
    if batch.prompt_len < 1 or T < 1:
        raise ValueError(
            f"TrainBatch.prompt_len ({batch.prompt_len}) must leave >= 1 prompt column and >= 1 "
            f"response column in input_ids of width {batch.input_ids.shape[1]}"
        )
    per_token = ["response_mask", "rollout_logprobs"] + (["credit"] if batch.credit is not None else [])
    for name in per_token:
        if tuple(getattr(batch, name).shape) != (B, T):
            raise ValueError(
                f"TrainBatch.{name} must be (B, T) = {(B, T)}, got {tuple(getattr(batch, name).shape)}"
            )
    shapes = ((B,),) if batch.credit is not None else ((B,), (B, T))
    if batch.advantages.shape not in shapes:
        raise ValueError(
            f"TrainBatch.advantages must be {' or '.join(map(str, shapes))} (a credit mask scales (B,) "
            f"advantages per token), got {tuple(batch.advantages.shape)}"
        )
    if tuple(batch.group_ids.shape) != (B,):
        raise ValueError(f"TrainBatch.group_ids must be (B,) = ({B},), got {tuple(batch.group_ids.shape)}")
    if bool((batch.response_mask.bool() & ~batch.attention_mask[:, batch.prompt_len :].bool()).any()):
        raise ValueError(
            "TrainBatch.response_mask marks tokens that attention_mask marks as padding; build "
            "batches with tgc_rl.batch.collate"
        )
    for name in ["advantages", *per_token[1:]]:
        if not bool(torch.isfinite(getattr(batch, name)).all()):
            raise ValueError(f"TrainBatch.{name} contains NaN or inf")
    group_bounds(batch.group_ids)
