"""How one rollout batch is dealt into optimizer steps: groups kept whole, or split across steps."""

from __future__ import annotations

import torch


def minibatch_rows(
    n_groups: int, group_size: int, mini_batches: int, split: bool, gen: torch.Generator
) -> list[torch.Tensor]:
    """Row indices of each optimizer step. Whole: groups shuffled into mini-batches. Split: every group's
    responses shuffled and dealt evenly over all mini-batches (the pipeline breaker of
    docs/objectives.md#step-constant-normalisers)."""
    rows = torch.arange(n_groups * group_size).view(n_groups, group_size)
    if not split:
        order = torch.randperm(n_groups, generator=gen)
        return [rows[chunk].flatten() for chunk in order.chunk(mini_batches)]
    perm = torch.argsort(torch.rand(n_groups, group_size, generator=gen), 1)
    dealt = rows.gather(1, perm).view(n_groups, mini_batches, group_size // mini_batches)
    return [dealt[:, m].flatten() for m in range(mini_batches)]


def split_sequence_weights(
    objective,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    rows: torch.Tensor,
) -> torch.Tensor:
    """DFPO weights of `rows` when their groups are split across optimizer steps.

    The transform needs whole groups (`Objective.sequence_weights` over the whole batch); the result
    is rescaled from the batch's normaliser to the normaliser of the optimizer step that holds `rows`.
    """
    with torch.no_grad():
        weights = objective.sequence_weights(logprobs, old_logprobs, advantages, mask, group_ids)
    if objective.config.aggregation == "token_mean":
        scale = float(mask.sum()) / float(mask[rows].sum())
    else:
        scale = mask.shape[0] / rows.numel()
    return weights[rows] * scale
