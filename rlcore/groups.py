"""Group indexing: map arbitrary integer group ids to dense indices and reduce per group (vectorised)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class GroupIndex:
    """Dense view of `group_ids`: `inverse[i]` is row i's group in 0..n-1, `ids[g]` its original id."""

    ids: Tensor
    inverse: Tensor
    counts: Tensor

    @classmethod
    def of(cls, group_ids: Tensor) -> GroupIndex:
        ids, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
        return cls(ids=ids, inverse=inverse, counts=counts)

    @property
    def n(self) -> int:
        return int(self.ids.numel())

    def sum(self, x: Tensor) -> Tensor:
        """Per-group sums of the rows of x: (B, ...) -> (n, ...)."""
        out = torch.zeros((self.n, *x.shape[1:]), dtype=x.dtype, device=x.device)
        return out.index_add_(0, self.inverse, x)

    def mean(self, x: Tensor) -> Tensor:
        return self.sum(x) / self.counts.to(x.dtype).view(-1, *([1] * (x.ndim - 1)))

    def amin(self, x: Tensor) -> Tensor:
        """Per-group minima of a (B,) tensor."""
        out = torch.full(
            (self.n,),
            torch.finfo(x.dtype).max if x.is_floating_point() else torch.iinfo(x.dtype).max,
            dtype=x.dtype,
            device=x.device,
        )
        return out.scatter_reduce_(0, self.inverse, x, reduce="amin")

    def describe_sizes(self, limit: int = 5) -> str:
        """'group 3: 7, group 9: 8, ...' for error messages."""
        pairs = [
            f"group {int(i)}: {int(c)}" for i, c in zip(self.ids[:limit], self.counts[:limit], strict=True)
        ]
        more = f", ... ({self.n} groups)" if self.n > limit else ""
        return ", ".join(pairs) + more
