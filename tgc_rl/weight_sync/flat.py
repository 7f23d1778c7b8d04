"""How the learner's weights travel to the rollout engines: one flat byte buffer in the Ray object store.

A dict of torch tensors put into the object store is pickled tensor by tensor (through torch's own
serialisation), and every replica pays that again on `ray.get` (0.3-2 s for 135M parameters here). A single
contiguous numpy buffer plus a small index is written with one memcpy, and `ray.get` on the same node maps
it read-only from shared memory without copying, so each replica reads the weights straight from the store.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

_ALIGN = 64  # byte alignment of each tensor in the buffer (cache line; any dtype view is aligned)


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # torch dtype name, e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int  # byte offset in the buffer
    nbytes: int


@dataclass
class FlatWeights:
    """A full (unsharded) state dict packed into one uint8 buffer; pickles as a single out-of-band buffer."""

    buffer: np.ndarray  # uint8, 1-D
    entries: list[TensorEntry]

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor]) -> FlatWeights:
        entries: list[TensorEntry] = []
        offset = 0
        for name, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"weights[{name!r}] is a {type(t).__name__}, expected a torch.Tensor")
            nbytes = t.numel() * t.element_size()
            entries.append(
                TensorEntry(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes)
            )
            offset += -(-nbytes // _ALIGN) * _ALIGN
        buffer = np.empty(offset, dtype=np.uint8)
        flat = torch.from_numpy(buffer)
        for e, t in zip(entries, state_dict.values(), strict=True):
            src = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            flat[e.offset : e.offset + e.nbytes].copy_(src)
        return cls(buffer, entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) views into the buffer, no copies. Read-only when the buffer came from the object store."""
        with warnings.catch_warnings():
            # the object store hands out a read-only array; the engines only read from these views
            warnings.filterwarnings("ignore", message=".*not writable.*")
            flat = torch.from_numpy(self.buffer)
        for e in self.entries:
            dtype = getattr(torch, e.dtype)
            yield e.name, flat[e.offset : e.offset + e.nbytes].view(dtype).view(e.shape)

    def to_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.items())


Weights = Mapping[str, torch.Tensor] | FlatWeights


def named_tensors(weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
    """Iterate (HF parameter name, tensor) over either weights format, without copying."""
    if isinstance(weights, FlatWeights):
        return weights.items()
    if isinstance(weights, Mapping):
        return iter(weights.items())
    raise TypeError(
        f"weights must be a dict[str, torch.Tensor] or a FlatWeights, got {type(weights).__name__}; "
        "publish the learner's full state dict with tgc_rl.weight_sync.flat.publish_weights(state_dict)"
    )


def weights_nbytes(weights: Weights) -> int:
    if isinstance(weights, FlatWeights):
        return weights.nbytes
    return sum(t.numel() * t.element_size() for t in weights.values())


def publish_weights(state_dict: Mapping[str, torch.Tensor]):
    """Put a full state dict into the Ray object store in the fast flat format; returns the ObjectRef."""
    import ray

    return ray.put(FlatWeights.from_state_dict(state_dict))
