"""Input checks with messages that name the argument and the fix (never `assert`).

Checks are O(1) passes over each tensor: finiteness is tested on a sum (NaN/inf propagate), and the
exact offending position is only searched for when that cheap test fails.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_tensor(
    name: str,
    x: object,
    shape: tuple[int, ...] | None = None,
    *,
    ndim: int | tuple[int, ...] | None = None,
    kind: str = "float",
) -> Tensor:
    """x must be a tensor of the given shape/ndim and dtype kind ('float', 'int', 'mask')."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if x.ndim not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise ValueError(f"{name}: expected a {want} tensor, got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"{name}: expected shape {tuple(shape)} (matching logprobs/rewards), got {tuple(x.shape)}"
        )
    if kind == "float" and not x.is_floating_point():
        raise ValueError(
            f"{name}: expected a floating-point tensor, got dtype {x.dtype}; convert with .float()"
        )
    if kind == "int" and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise ValueError(f"{name}: expected an integer tensor (torch.long), got dtype {x.dtype}")
    if kind == "mask" and x.is_complex():
        raise ValueError(f"{name}: expected a bool or 0/1 tensor, got dtype {x.dtype}")
    return x


def check_finite(name: str, x: Tensor) -> None:
    """No NaN/inf anywhere in x (a NaN in padding still poisons the gradient through exp/ratios)."""
    if torch.isfinite(x.sum()):
        return
    bad = ~torch.isfinite(x)
    if not bool(bad.any()):  # the sum overflowed on finite values: fine
        return
    first = [int(i) for i in bad.nonzero()[0]]
    raise ValueError(
        f"{name}: contains {int(bad.sum())} NaN/inf value(s), first at index {tuple(first)}; "
        "fix the upstream computation (padding included) before calling the objective"
    )


def as_mask(
    name: str, mask: Tensor, shape: tuple[int, ...], dtype: torch.dtype, *, check_values: bool = True
) -> Tensor:
    """The response mask as a 0/1 tensor of `dtype`; bool, integer or float inputs accepted."""
    check_tensor(name, mask, shape, kind="mask")
    if mask.dtype == torch.bool:
        return bool_to_float(mask, dtype)
    if not check_values:
        return mask if mask.dtype == dtype else mask.to(dtype)
    lo, hi = torch.aminmax(mask)
    if lo < 0 or hi > 1:
        raise ValueError(f"{name}: values must be 0/1 (or bool), found range [{float(lo)}, {float(hi)}]")
    return mask if mask.dtype == dtype else mask.to(dtype)


def check_group_ids(group_ids: object, batch: int) -> Tensor:
    return check_tensor("group_ids", group_ids, (batch,), kind="int")


def bool_to_float(x: Tensor, dtype: torch.dtype) -> Tensor:
    """0/1 float copy of a bool tensor; via uint8, which is several times faster on CPU than bool -> float."""
    return x.view(torch.uint8).to(dtype) if x.is_contiguous() else x.to(dtype)
