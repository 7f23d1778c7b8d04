"""How one rollout batch is cut into optimizer steps, ranks and micro-batches, always along whole groups.

Cancellation needs every group whole inside one optimizer step (docs/objectives.md#step-constant-normalisers), and the
group-coupled parts of an objective (DFPO's group minimum, diagnostic D1) need it whole inside one loss
call, so the unit of every split here is a group. Every rank computes the same plan from the same batch
(no communication); ranks that get fewer micro-batches run zero-weight padding passes so that all ranks
issue the same FSDP collectives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from tgc_rl.batch import SampledBatch, TrainBatch, group_bounds

BatchT = TypeVar("BatchT", bound=SampledBatch)


@dataclass(frozen=True)
class Group:
    start: int  # first row in the batch
    stop: int  # one past the last row
    tokens: int  # non-padding tokens (prompt + response) of all rows: the full forward's cost
    longest: int  # the longest row's non-padding tokens
    tree_tokens: (
        int  # the prompt once plus every response (observations included): the tree forward's cost, at most
    )

    @property
    def rows(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True)
class MicroBatchLimit:
    """How large one forward/backward may be: at most `rows` sequences and, when `tokens` is set, at most that
    many tokens as the forward computes them (padding counted: `tree` forwards pad each group's token tree to
    the longest in the micro-batch, row forwards each row to the longest row)."""

    rows: int
    tokens: int | None = None
    tree: bool = False

    def fits(self, groups: list[Group]) -> bool:
        rows = sum(g.stop - g.start for g in groups)
        if rows > self.rows:
            return False
        if self.tokens is None:
            return True
        if self.tree:
            return len(groups) * max(g.tree_tokens for g in groups) <= self.tokens
        return rows * max(g.longest for g in groups) <= self.tokens


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step: `rows` of the batch (whole groups) and, per rank, its micro-batches."""

    rows: torch.Tensor
    micro: list[list[torch.Tensor]]  # micro[rank] = row tensors; every rank has the same count

    def for_rank(self, rank: int) -> list[torch.Tensor | None]:
        """This rank's micro-batches; None marks a padding pass (the rank has run out of groups)."""
        mine = self.micro[rank]
        return [*mine, *[None] * (max(len(m) for m in self.micro) - len(mine))]


def group_spans(batch: SampledBatch) -> list[Group]:
    """The batch's groups as contiguous row spans; a group id that reappears later is an error."""
    tokens = batch.attention_mask.sum(1).tolist()
    prompt = batch.attention_mask[:, : batch.prompt_len].sum(1).tolist()
    response = batch.history_mask.sum(1).tolist()  # observation tokens are tree nodes too (multi-turn)
    return [
        Group(
            start,
            stop,
            int(sum(tokens[start:stop])),
            longest=int(max(tokens[start:stop])),
            tree_tokens=int(prompt[start] + sum(response[start:stop])),
        )
        for start, stop in group_bounds(batch.group_ids)
    ]


def plan_minibatches(
    groups: list[Group],
    mini_batches: int,
    world_size: int,
    limit: MicroBatchLimit,
    order: list[int] | None = None,
) -> list[MiniBatch]:
    """Split `groups` (taken in `order`) into `mini_batches` optimizer steps of whole groups, each shared
    out to `world_size` ranks and cut into micro-batches within `limit` (at least one group each: a group
    larger than the limit stays whole)."""
    if len(groups) < mini_batches:
        raise ValueError(
            f"optim.mini_batches ({mini_batches}) exceeds the number of groups in the batch "
            f"({len(groups)}); lower mini_batches or raise prompts_per_step"
        )
    seq = [groups[i] for i in (order if order is not None else range(len(groups)))]
    plans = []
    for k in range(mini_batches):
        part = seq[k * len(seq) // mini_batches : (k + 1) * len(seq) // mini_batches]
        rows = torch.tensor([r for g in part for r in g.rows], dtype=torch.long)
        micro = [_micro_batches(share, limit) for share in _share_out(part, world_size)]
        plans.append(MiniBatch(rows, micro))
    return plans


def _share_out(groups: list[Group], world_size: int) -> list[list[Group]]:
    """Equal group counts per rank (+-1), balancing tokens: largest group first to the lightest rank."""
    counts = [len(groups) // world_size + (r < len(groups) % world_size) for r in range(world_size)]
    shares: list[list[Group]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for g in sorted(groups, key=lambda g: (-g.tokens, g.start)):
        rank = min((r for r in range(world_size) if len(shares[r]) < counts[r]), key=lambda r: (load[r], r))
        shares[rank].append(g)
        load[rank] += g.tokens
    return shares


def _micro_batches(groups: list[Group], limit: MicroBatchLimit) -> list[torch.Tensor]:
    # Similar lengths together: less padding inside each micro-batch.
    cuts: list[list[Group]] = []
    for g in sorted(groups, key=lambda g: (g.tokens, g.start)):
        if cuts and limit.fits([*cuts[-1], g]):
            cuts[-1].append(g)
        else:
            cuts.append([g])
    return [torch.tensor([r for g in cut for r in g.rows], dtype=torch.long) for cut in cuts]


def trim_padding(batch: BatchT) -> BatchT:
    """Drop prompt columns that are padding in every row and response columns past the last model token
    (observation tokens after it predict nothing that is trained: the forward is causal)."""
    attn = batch.attention_mask
    P = batch.prompt_len
    real_prompt = attn[:, :P].bool().any(0)
    left = int(real_prompt.nonzero()[0]) if bool(real_prompt.any()) else P - 1
    left = min(left, P - 1)  # keep >= 1 prompt column: it predicts the first response token
    resp = batch.response_mask.bool().any(0)
    T = int(resp.nonzero()[-1]) + 1 if bool(resp.any()) else 1
    cols = slice(left, P + T)
    per_token: dict[str, Tensor] = {}
    if isinstance(batch, TrainBatch):
        if batch.advantages.ndim == 2:
            per_token["advantages"] = batch.advantages[:, :T]
        if batch.credit is not None:
            per_token["credit"] = batch.credit[:, :T]
    return dataclasses.replace(
        batch,
        input_ids=batch.input_ids[:, cols],
        attention_mask=attn[:, cols],
        response_mask=batch.response_mask[:, :T],
        rollout_logprobs=batch.rollout_logprobs[:, :T],
        prompt_len=P - left,
        **per_token,
    )
