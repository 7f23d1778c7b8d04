"""Tree attention in memory linear in the tree's size: the shared-prompt forward without an L x L mask.

A packed token tree (tgc_rl/learner/prefix_tree.py) numbers its nodes depth-first, so query a sees key b
iff b <= a < subtree_end[b]. The dense path builds that (L x L) mask per group, and SDPA on CPU widens a
boolean mask to float: at 2 prompts x 8 responses x 4096 tokens (L ~ 33k) that is ~1 GB of mask plus ~4 GB of
float mask per tree, more than the whole rest of the step. Here the attention runs one block of `block`
queries at a time, against only the keys that are an ancestor of some query in the block (found from
subtree_end with two comparisons: an earlier sibling's subtree ends before the block starts). For a group of
long responses that branch early, each query's keys are the prompt and its own response's ancestors, the same
keys as its row in the full forward: the work is the plain forward's and nothing scales with L x L.

The autograd function saves q, k, v, the output and the log-sum-exp (linear in L) and recomputes each block's
probabilities in backward (flash-attention style). FlexAttention (torch.nn.attention.flex_attention) would do
the same with a block mask, but torch 2.13 has no FlexAttention backward on CPU ("FlexAttention does not
support backward on CPU"), so this kernel is plain torch ops and runs wherever the learner runs. On a CUDA
device the tree goes to compiled FlexAttention instead: the first GPU check (H200, benchmarks/gpu/) measured
this kernel 5x slower than the plain forward at prompt 2k / response 2k (a Python loop of small matmuls and a
host sync per block), while a block mask skips the same key blocks inside one fused kernel.

It plugs into Hugging Face models through their attention interface: `enable(lm)` registers the `tgc_tree`
implementation (a dispatcher) and switches an SDPA model to it. The dispatcher sends a tree (its attention
mask a (k, 1, 1, L) integer tensor of subtree ends, `TreeEnds`) to this kernel and every other call (the full
forward's masks, the dense tree mask) to SDPA unchanged, so one model serves both paths, and a layer that
activation checkpointing re-runs in backward takes the same path as in forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel

IMPLEMENTATION = "tgc_tree"
# Queries per block: a block's transient buffers are heads x block x (its keys) floats, ~4 of them in backward
# (head 4, 4.6k keys: 19 MB each); larger blocks amortise the per-block Python overhead.
DEFAULT_BLOCK = 256


def tree_ends_mask(subtree_end: Tensor) -> Tensor:
    """The attention mask the model is given for a tree: (k, L) subtree ends as a (k, 1, 1, L) long tensor.
    Hugging Face passes a 4D mask through unchanged; its integer dtype tells the dispatcher it is a tree."""
    return subtree_end.to(torch.long)[:, None, None, :]


def _block_keys(end: Tensor, idx: Tensor, qs: int, qe: int) -> Tensor:
    """Indices of keys that some query in [qs, qe) attends to: b < qe and b's subtree reaches past qs."""
    return ((idx < qe) & (end > qs)).nonzero().flatten()


def _block_scores(
    q: Tensor, k: Tensor, keys: Tensor, end_keys: Tensor, qs: int, qe: int, scale: float
) -> Tensor:
    """Masked scores (Hkv, G * n, m) in >= fp32 for queries [qs, qe) of one tree against its block's keys.
    q: (H, L, d) with H = Hkv * G (query head h uses key head h // G, as Hugging Face's repeat_kv)."""
    hkv, n = k.shape[0], qe - qs
    acc = torch.promote_types(q.dtype, torch.float32)
    qb = q[:, qs:qe].to(acc).reshape(hkv, -1, q.shape[-1])  # (Hkv, G * n, d), rows ordered (g, query)
    s = torch.bmm(qb, k[:, keys].to(acc).transpose(1, 2)).mul_(scale)
    a = torch.arange(qs, qe, device=q.device)[:, None]
    allowed = (keys[None, :] <= a) & (a < end_keys[None, :])  # (n, m): b is an ancestor of a, or a itself
    s.view(hkv, -1, n, keys.shape[0]).masked_fill_(~allowed, float("-inf"))
    return s


class _TreeAttention(torch.autograd.Function):
    """softmax(q k^T * scale + tree mask) v per tree, block by block; q (B, H, L, d), k and v (B, Hkv, L, d)."""

    @staticmethod
    def forward(ctx, q, k, v, ends, scale, block):
        B, H, L, d = q.shape
        hkv = k.shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)
        out = torch.empty(B, H, L, v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(B, H, L, dtype=acc, device=q.device)
        idx = torch.arange(L, device=q.device)
        for b in range(B):
            for qs in range(0, L, block):
                qe = min(qs + block, L)
                keys = _block_keys(ends[b], idx, qs, qe)
                s = _block_scores(q[b], k[b], keys, ends[b, keys], qs, qe, scale)
                m = s.logsumexp(-1, keepdim=True)
                o = torch.bmm(s.sub_(m).exp_(), v[b][:, keys].to(acc))  # (Hkv, G * n, dv)
                out[b, :, qs:qe] = o.view(H, qe - qs, -1).to(q.dtype)
                lse[b, :, qs:qe] = m.view(H, qe - qs)
        ctx.save_for_backward(q, k, v, ends, out, lse)
        ctx.scale, ctx.block, ctx.hkv = scale, block, hkv
        return out

    @staticmethod
    def backward(ctx, g_out):
        q, k, v, ends, out, lse = ctx.saved_tensors
        scale, block, hkv = ctx.scale, ctx.block, ctx.hkv
        B, H, L, _ = q.shape
        acc = lse.dtype
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        delta = (g_out.to(acc) * out.to(acc)).sum(-1)  # (B, H, L): rowsum(dO * O) = sum_j p_j dp_j
        idx = torch.arange(L, device=q.device)
        for b in range(B):
            for qs in range(0, L, block):
                qe = min(qs + block, L)
                n = qe - qs
                keys = _block_keys(ends[b], idx, qs, qe)
                p = _block_scores(q[b], k[b], keys, ends[b, keys], qs, qe, scale)
                p.sub_(lse[b, :, qs:qe].reshape(hkv, -1, 1)).exp_()
                go = g_out[b, :, qs:qe].to(acc).reshape(hkv, -1, g_out.shape[-1])
                vb, kb = v[b][:, keys].to(acc), k[b][:, keys].to(acc)
                dv[b].index_add_(1, keys, torch.bmm(p.transpose(1, 2), go))
                ds = torch.bmm(go, vb.transpose(1, 2))  # dP
                ds.sub_(delta[b, :, qs:qe].reshape(hkv, -1, 1)).mul_(p).mul_(scale)
                del p
                dq[b, :, qs:qe] = torch.bmm(ds, kb).view(H, n, -1).to(q.dtype)
                qb = q[b, :, qs:qe].to(acc).reshape(hkv, -1, q.shape[-1])
                dk[b].index_add_(1, keys, torch.bmm(ds.transpose(1, 2), qb))
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None


# One compiled FlexAttention for every shape (dynamic: a new tree length must not recompile), built on first use.
_flex: Any = None
# The block mask of the latest tree: every layer (and a checkpointed layer's re-run) gets the same mask tensor.
_flex_mask: tuple[Tensor, Any] | None = None
FLEX_BLOCK = 128  # FlexAttention's block size: the subtree ends are padded to a multiple of it


def kernel_name(device: torch.device) -> str:
    """The tree kernel a device runs: compiled FlexAttention on CUDA (its backward needs CUDA), the block kernel
    elsewhere. The dispatcher follows it, and the learner names its choice by it."""
    return "flex" if device.type == "cuda" else "block"


def flex_tree_attention(q: Tensor, k: Tensor, v: Tensor, ends_mask: Tensor, scale: float) -> Tensor:
    """tree_attention through FlexAttention (CUDA): query a sees key b iff b <= a < subtree_end[b]. ends_mask is
    the model's (B, 1, 1, L) mask from tree_ends_mask; its block mask is built once and reused by every layer."""
    global _flex, _flex_mask
    from torch.nn.attention.flex_attention import flex_attention

    if _flex is None:
        _flex = torch.compile(flex_attention, dynamic=True)
    if _flex_mask is None or _flex_mask[0] is not ends_mask:
        _flex_mask = (ends_mask, tree_block_mask(ends_mask))
    return _flex(q, k, v, block_mask=_flex_mask[1], scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def tree_block_mask(ends_mask: Tensor) -> Any:
    """FlexAttention's BlockMask of the trees in ends_mask ((B, 1, 1, L) subtree ends, tree_ends_mask's form):
    query a sees key b iff b <= a < subtree_end[b]."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, L = ends_mask.shape[0], ends_mask.shape[-1]
    # Padded keys get end 0, so no query sees them (create_block_mask evaluates whole blocks).
    ends = torch.nn.functional.pad(ends_mask[:, 0, 0], (0, -L % FLEX_BLOCK))

    def ancestor_or_self(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) & (q_idx < ends[b, kv_idx])

    return create_block_mask(ancestor_or_self, B, None, L, L, device=ends_mask.device)


def tree_attention(
    q: Tensor, k: Tensor, v: Tensor, subtree_end: Tensor, scale: float, block: int = DEFAULT_BLOCK
) -> Tensor:
    """Attention of each tree's nodes to their ancestors and themselves. q: (B, H, L, d); k, v: (B, Hkv, L, d)
    with H a multiple of Hkv; subtree_end: (B, L), one past each node's last descendant (depth-first order).
    Returns (B, H, L, dv)."""
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of key heads {k.shape[1]}")
    return _TreeAttention.apply(q, k, v, subtree_end.to(torch.long), float(scale), block)


def _dispatch(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The `tgc_tree` attention implementation: a tree mask (integer) to tree_attention, anything else to SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None or attention_mask.is_floating_point() or attention_mask.dtype == torch.bool:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if dropout:
        raise ValueError("tree attention has no dropout; the learner trains with attention_dropout 0")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if kernel_name(query.device) == "flex":
        out = flex_tree_attention(query, key, value, attention_mask, scale)
    else:
        out = tree_attention(query, key, value, attention_mask[:, 0, 0], scale)
    return out.transpose(1, 2).contiguous(), None  # (B, L, H, d), as the other implementations return


def enable(lm: PreTrainedModel) -> bool:
    """Switch an SDPA model to the `tgc_tree` dispatcher (the same SDPA calls for every non-tree mask).
    False where the model is not on SDPA (eager attention materialises L x L scores anyway: trees stay dense)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    impl = lm.config._attn_implementation
    if impl == IMPLEMENTATION:
        return True
    if impl != "sdpa":
        return False
    AttentionInterface.register(IMPLEMENTATION, _dispatch)
    if IMPLEMENTATION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)  # full forwards: SDPA's own masks
    lm.set_attn_implementation(IMPLEMENTATION)
    return lm.config._attn_implementation == IMPLEMENTATION
