"""How one rollout batch is cut into optimizer steps, ranks and micro-batches, always along whole groups.

Cancellation needs every group whole inside one optimizer step (docs/objectives.md#step-constant-normalisers), and the
group-coupled parts of an objective (DFPO's group minimum, diagnostic D1) need it whole inside one loss
call, so the unit of every split here is a group. Every rank computes the same plan from the same batch
(no communication); ranks that get fewer micro-batches run zero-weight padding passes so that all ranks
issue the same FSDP collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.batch import TrainBatch


@dataclass(frozen=True)
class Group:
    start: int  # first row in the batch
    stop: int  # one past the last row
    tokens: int  # non-padding tokens (prompt + response): the compute cost of the group

    @property
    def rows(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step: `rows` of the batch (whole groups) and, per rank, its micro-batches."""

    rows: torch.Tensor
    micro: list[list[torch.Tensor]]  # micro[rank] = row tensors; every rank has the same count

    def for_rank(self, rank: int) -> list[torch.Tensor | None]:
        """This rank's micro-batches; None marks a padding pass (the rank has run out of groups)."""
        mine = self.micro[rank]
        return [*mine, *[None] * (max(len(m) for m in self.micro) - len(mine))]


def validate_batch(batch: TrainBatch) -> None:
    """Shapes and the group layout the learner relies on; ValueError names the field and the fix."""
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
    for name in ("response_mask", "rollout_logprobs"):
        if tuple(getattr(batch, name).shape) != (B, T):
            raise ValueError(
                f"TrainBatch.{name} must be (B, T) = {(B, T)}, got {tuple(getattr(batch, name).shape)}"
            )
    if batch.advantages.shape not in ((B,), (B, T)):
        raise ValueError(
            f"TrainBatch.advantages must be (B,) or (B, T) = {(B, T)}, got {tuple(batch.advantages.shape)}"
        )
    if tuple(batch.group_ids.shape) != (B,):
        raise ValueError(f"TrainBatch.group_ids must be (B,) = ({B},), got {tuple(batch.group_ids.shape)}")
    if bool((batch.response_mask.bool() & ~batch.attention_mask[:, batch.prompt_len :].bool()).any()):
        raise ValueError(
            "TrainBatch.response_mask marks tokens that attention_mask marks as padding; build "
            "batches with services.batch.collate"
        )
    for name in ("advantages", "rollout_logprobs"):
        if not bool(torch.isfinite(getattr(batch, name)).all()):
            raise ValueError(f"TrainBatch.{name} contains NaN or inf")
    group_spans(batch)  # raises on split groups


def group_spans(batch: TrainBatch) -> list[Group]:
    """The batch's groups as contiguous row spans; a group id that reappears later is an error."""
    ids = batch.group_ids.tolist()
    tokens = batch.attention_mask.sum(1).tolist()
    groups, seen, start = [], set(), 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[start]:
            if ids[start] in seen:
                raise ValueError(
                    f"TrainBatch.group_ids: group {ids[start]} is not contiguous; the G rows of a "
                    "group must be adjacent (services.batch.collate keeps them so)"
                )
            seen.add(ids[start])
            groups.append(Group(start, i, int(sum(tokens[start:i]))))
            start = i
    return groups


def plan_minibatches(
    groups: list[Group],
    mini_batches: int,
    world_size: int,
    micro_batch_size: int,
    order: list[int] | None = None,
) -> list[MiniBatch]:
    """Split `groups` (taken in `order`) into `mini_batches` optimizer steps of whole groups, each shared
    out to `world_size` ranks and cut into micro-batches of at most `micro_batch_size` rows (at least one
    group each: a group larger than the micro-batch stays whole)."""
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
        micro = [_micro_batches(share, micro_batch_size) for share in _share_out(part, world_size)]
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


def _micro_batches(groups: list[Group], micro_batch_size: int) -> list[torch.Tensor]:
    # Similar lengths together: less padding inside each micro-batch.
    out, current, size = [], [], 0
    for g in sorted(groups, key=lambda g: (g.tokens, g.start)):
        n = g.stop - g.start
        if current and size + n > micro_batch_size:
            out.append(torch.tensor(current, dtype=torch.long))
            current, size = [], 0
        current.extend(g.rows)
        size += n
    if current:
        out.append(torch.tensor(current, dtype=torch.long))
    return out


def trim_padding(batch: TrainBatch) -> TrainBatch:
    """Drop prompt columns that are padding in every row and response columns past the longest response."""
    attn = batch.attention_mask
    P = batch.prompt_len
    real_prompt = attn[:, :P].bool().any(0)
    left = int(real_prompt.nonzero()[0]) if bool(real_prompt.any()) else P - 1
    left = min(left, P - 1)  # keep >= 1 prompt column: it predicts the first response token
    resp = batch.response_mask.bool().any(0)
    T = int(resp.nonzero()[-1]) + 1 if bool(resp.any()) else 1
    cols = slice(left, P + T)
    return TrainBatch(
        batch.input_ids[:, cols],
        attn[:, cols],
        batch.response_mask[:, :T],
        batch.advantages[:, :T] if batch.advantages.ndim == 2 else batch.advantages,
        batch.group_ids,
        batch.rollout_logprobs[:, :T],
        batch.rewards,
        batch.versions,
        P - left,
        dict(batch.meta),
    )
