"""vLLM's CPU LoRA ops with one matmul per adapter instead of one weight copy per token.

vLLM's CPU backend applies LoRA with PyTorch ops (`vllm.lora.ops.torch_ops`) that index the stacked adapter
weights by each token's adapter, `weights[indices]`: a copy of a (rank x in) or (out x rank) matrix for every
token, then a batched mat-vec. For SmolLM2-135M with rank-16 adapters on every linear layer that is ~20 MB
copied per token per step (more than the base model's weights for a batch of 32 decoding requests), and a
prompt's prefill copies it for every prompt token. Here the tokens are grouped by adapter and each group is
one matmul with its adapter's matrix, which is what the copies computed: the same result up to floating-point
summation order. A tgc-rl engine serves one adapter (a shared engine one per tenant), so a step is one matmul
per LoRA layer and slice.

`install()` replaces the three row-wise ops (the prefill ops call them too) in vLLM's modules; call it in the
engine's process before the engine starts. Shapes the grouping does not cover go to vLLM's own op unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_ORIGINAL: dict[str, Callable] = {}


def _per_adapter(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype):
    """Row t: inputs[t] @ weights[indices[t]].T (an index picks its slot as Python indexing does, -1 the last,
    as vLLM's op does); None where the shapes are not the plain (tokens, in) x (slots, [1,] out, in) case."""
    w = weights.squeeze(1) if weights.dim() == 4 else weights
    if inputs.dim() != 2 or w.dim() != 3 or indices.dim() != 1 or inputs.shape[0] != indices.shape[0]:
        return None
    x = inputs.to(dtype)
    slots = torch.unique(indices)
    if slots.numel() == 1:
        return x @ w[slots[0]].to(dtype).T
    out = x.new_empty(x.shape[0], w.shape[1])
    for slot in slots:
        rows = indices == slot
        out[rows] = x[rows] @ w[slot].to(dtype).T
    return out


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        return _ORIGINAL["bgmv_shrink"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None or outputs.shape[0] != output_tensor.shape[0]:
        return _ORIGINAL["bgmv_expand"](
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs
        )
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:, :common]
    else:
        output_tensor[:, :common] = outputs[:, :common]


def bgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    lora_indices_tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
):
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None or outputs.shape != (output_tensor.shape[0], slice_size):
        return _ORIGINAL["bgmv_expand_slice"](
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs
        )
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


_OURS = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}


def install() -> None:
    """Route vLLM's CPU LoRA ops (in this process) through the per-adapter matmuls; idempotent."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for name, op in _OURS.items():
        _ORIGINAL.setdefault(name, getattr(lora_ops, name))
        for module in (lora_ops, punica_cpu):  # the prefill ops look theirs up in lora_ops at call time
            setattr(module, name, op)
