"""Per-token log-probabilities and entropies of the sampled response tokens, without whole logits.

The (T x vocab) logits of a sequence are the largest tensor of an RL step (SmolLM2: 49152 floats per
token). `PolicyLogprobs` runs the decoder body once to get hidden states, then applies the output
head + log_softmax + gather (+ entropy) to `chunk_tokens` tokens at a time. With grad enabled a custom
autograd function saves only the hidden states and recomputes one chunk's logits at a time in backward,
turning them into their gradient in place: peak memory holds ~2 chunks of logits, never all of them.

The module wraps the Hugging Face causal LM so that FSDP2 can shard it as the root unit: the root's
forward hooks gather the embedding, final norm and (tied) head that this forward uses directly.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from tgc_rl.learner import tree_attention
from tgc_rl.learner.prefix_tree import PackedTrees, pack_trees, supports_prefix_tree

log = logging.getLogger(__name__)

# Trees of at most this many nodes (padded, per micro-batch) use the dense L x L mask, longer ones the tree
# kernel (tgc_rl/learner/tree_attention.py), by device unless optim.dense_tree_max_tokens says otherwise.
# CPU (the block kernel), measured on a 2-core AVX2 CPU, attention forward + backward, 4 heads of 64, one group of
# 8: the same time at 512 nodes, the kernel 1.4x faster at 768, 3.7x at 2304 and 4.2x at 4352, while the dense
# mask (and SDPA's float copy of it) grows as L^2.
DENSE_TREE_MAX_TOKENS = 1024
# CUDA (FlexAttention, compiled once for every length): always the kernel. The GPU check's tree_threshold part on
# an H200 (the 0.5B shape, bf16, forward + backward, one group of 8), each pass a batch of new lengths as in
# training: FlexAttention 1.5-2.0x faster than the dense mask from 285 to 5659 nodes. The dense mask's SDPA (cuDNN)
# pays for every new shape; on one repeated shape it had looked faster up to ~6k nodes. Learner step at 512 +
# 1024 tokens: 0.86 s against 1.43 s with the dense mask below 8192 nodes (benchmarks/gpu/, 2026-11-28).
DENSE_TREE_MAX_TOKENS_CUDA = 0


def position_ids(attention_mask: Tensor) -> Tensor:
    """Positions counted over real tokens only, so a left-padded prompt starts at position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def _chunk_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, inv_temperature: float) -> Tensor:
    """log_softmax of one chunk's logits, in >= fp32, computed in place in a single (C, V) buffer."""
    z = F.linear(hidden, weight, bias)
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    if inv_temperature != 1.0:
        z.mul_(inv_temperature)
    return z.sub_(z.logsumexp(-1, keepdim=True))


def _chunk_bounds(rows: Tensor, n: int, chunk: int) -> list[int]:
    """Target index ranges per chunk of hidden rows (rows sorted): chunk c owns targets [b[c], b[c + 1])."""
    return torch.searchsorted(rows, torch.arange(0, n + chunk, chunk, device=rows.device)).tolist()


def _forward_chunks(hidden, weight, bias, targets, rows, chunk, inv_temperature) -> tuple[Tensor, Tensor]:
    n = hidden.shape[0]
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    logp = torch.empty(targets.shape[0], dtype=dtype, device=hidden.device)
    ent = torch.empty(n, dtype=dtype, device=hidden.device)
    bounds = _chunk_bounds(rows, n, chunk)
    for c, s in enumerate(range(0, n, chunk)):
        lp = _chunk_logprobs(hidden[s : s + chunk], weight, bias, inv_temperature)
        a, b = bounds[c], bounds[c + 1]
        logp[a:b] = lp[rows[a:b] - s, targets[a:b]]
        ent[s : s + chunk] = -(lp.exp().mul_(lp)).sum(-1)
    return logp, ent


class _ChunkedHead(torch.autograd.Function):
    """Head + log_softmax + gather + entropy whose backward recomputes each chunk's logits and turns them
    into d(loss)/d(logits) in place: at most ~2 chunk-sized buffers live at any time, in either pass.
    Target j is read from hidden row rows[j] (sorted); the entropy is one per hidden row.

    With log p = z - lse (z = logits / temperature), p = exp(log p) and H = -sum p log p:
        d log p_y / dz = onehot(y) - p,    dH / dz = -p (log p + H)
    so a row with several targets gets -p * (sum of their gradients) plus each at its own target.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, rows, chunk, inv_temperature):
        logp, ent = _forward_chunks(hidden, weight, bias, targets, rows, chunk, inv_temperature)
        ctx.save_for_backward(hidden, weight, bias, targets, rows, ent)
        ctx.chunk, ctx.inv_temperature = chunk, inv_temperature
        ctx.set_materialize_grads(
            False
        )  # an unused output (usually the entropy) arrives as None: skip its terms
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, targets, rows, ent = ctx.saved_tensors
        chunk, inv_t = ctx.chunk, ctx.inv_temperature
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None, None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(weight.dtype, torch.float32)  # bf16 weights: accumulate chunks in fp32
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        bounds = _chunk_bounds(rows, hidden.shape[0], chunk)
        for c, s in enumerate(range(0, hidden.shape[0], chunk)):
            h = hidden[s : s + chunk]
            a, b = bounds[c], bounds[c + 1]
            local, t = rows[a:b] - s, targets[a:b]
            lp = _chunk_logprobs(h, weight, bias, inv_t)
            p = lp.exp()
            g = lp  # reuse the buffer: g = -p * (g_ent * (log p + H) + g_logp), then + g_logp at the target
            if g_ent is not None:
                g.add_(ent[s : s + chunk, None]).mul_(g_ent[s : s + chunk, None])
            else:
                g.zero_()
            if g_logp is not None:
                g_row = torch.zeros(h.shape[0], dtype=g_logp.dtype, device=g.device).index_add_(
                    0, local, g_logp[a:b]
                )
                g.add_(g_row[:, None])
            g.mul_(p).neg_()
            del p
            if g_logp is not None:
                g.index_put_((local, t), g_logp[a:b].to(g.dtype), accumulate=True)
            if inv_t != 1.0:
                g.mul_(inv_t)
            g = g.to(weight.dtype)
            if need_h:
                grad_h[s : s + chunk] = g @ weight
            if need_w:
                grad_w.add_(g.T @ h)
            if need_b:
                grad_b.add_(g.sum(0))
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_head_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    chunk_tokens: int,
    inv_temperature: float = 1.0,
    rows: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """log p(target) and the entropy of the full distribution for (M, H) hidden states, `chunk_tokens`
    rows at a time, forward and backward: the (M x vocab) logits never exist whole. Target j is predicted
    by hidden row rows[j] (default: row j); targets of one row share its logits, so equal targets of one
    row get bit-identical log-probs. Both outputs are per target."""
    order = None
    if rows is None:
        rows = torch.arange(targets.shape[0], device=targets.device)
    else:
        order = rows.argsort(stable=True)
        rows, targets = rows[order], targets[order]
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        lp, ent = _ChunkedHead.apply(hidden, weight, bias, targets, rows, chunk_tokens, inv_temperature)
    else:
        lp, ent = _forward_chunks(hidden, weight, bias, targets, rows, chunk_tokens, inv_temperature)
    if order is None:
        return lp, ent
    back = torch.empty_like(order).scatter_(0, order, torch.arange(order.shape[0], device=order.device))
    return lp[back], ent[rows[back]]


class PolicyLogprobs(nn.Module):
    """`forward(input_ids, attention_mask, prompt_len, response_mask) -> (logprobs, entropies)`, both (B, T)
    with zeros off the response mask. Only masked tokens go through the head (no work on padding).

    With `prefix_tree` (and a model that supports it) adjacent rows with the same prompt are computed as one
    token tree (tgc_rl/learner/prefix_tree.py): each shared token once, the same values and gradients. A tree
    longer than `dense_tree_max_tokens` nodes (None: by device, DENSE_TREE_MAX_TOKENS or _CUDA) runs the tree
    kernel instead of a dense mask (SDPA models)."""

    lm: PreTrainedModel

    def __init__(
        self,
        lm: PreTrainedModel,
        chunk_tokens: int,
        temperature: float = 1.0,
        prefix_tree: bool = False,
        dense_tree_max_tokens: int | None = None,
    ):
        super().__init__()
        if chunk_tokens < 1:
            raise ValueError(f"optim.logprob_chunk_tokens must be >= 1, got {chunk_tokens}")
        if temperature <= 0:
            raise ValueError(f"sampling.temperature must be > 0, got {temperature}")
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        self.inv_temperature = 1.0 / temperature  # the sampling policy is softmax(logits / temperature)
        self.prefix_tree = prefix_tree and supports_prefix_tree(lm)
        if dense_tree_max_tokens is not None and dense_tree_max_tokens < 0:
            raise ValueError(f"optim.dense_tree_max_tokens must be >= 0, got {dense_tree_max_tokens}")
        self.dense_tree_max_tokens = dense_tree_max_tokens
        # The block kernel needs the model on the `tgc_tree` dispatcher (SDPA models); eager ones stay dense.
        self.tree_kernel = self.prefix_tree and tree_attention.enable(lm)
        # "dense", "block" (the CPU kernel) or "flex" (FlexAttention on CUDA): the latest tree forward's choice
        self.last_tree_attention: str | None = None
        self._logged: set[str] = set()
        self.last_nodes = 0  # tokens the latest forward computed (its rows' tokens, or its trees' nodes)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, response_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        if prompt_len < 1:
            raise ValueError("prompt_len must be >= 1: the first response token is predicted from the prompt")
        trees = pack_trees(input_ids, attention_mask, prompt_len, response_mask) if self.prefix_tree else None
        if trees is not None:
            return self._tree_forward(trees.to(input_ids.device), response_mask)
        self.last_nodes = int(attention_mask.sum())
        body = self.lm.get_decoder()
        hidden = body(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            use_cache=False,
        ).last_hidden_state
        # Column prompt_len + t (response token t) is predicted by the hidden state of column prompt_len + t - 1.
        hidden = hidden[:, prompt_len - 1 : -1]
        targets = input_ids[:, prompt_len:]
        select = response_mask.bool()
        empty = not bool(select.any())
        if empty:
            # Still route one token through the head so every parameter gets a (zero) gradient: FSDP ranks
            # must reduce-scatter the same set of gradients.
            select = torch.zeros_like(select)
            select[0, 0] = True
        head = self.lm.get_output_embeddings()
        lp, ent = chunked_head_logprobs(
            hidden[select], head.weight, head.bias, targets[select], self.chunk_tokens, self.inv_temperature
        )
        if empty:
            lp, ent = lp * 0.0, ent * 0.0
        logprobs = lp.new_zeros(select.shape).masked_scatter(select, lp)
        entropies = ent.new_zeros(select.shape).masked_scatter(select, ent)
        return logprobs, entropies

    def _tree_mask(self, trees: PackedTrees) -> Tensor:
        """The dense (k, 1, L, L) mask up to dense_tree_max_tokens nodes, above it the tree kernel's subtree ends."""
        L = trees.input_ids.shape[1]
        kernel = tree_attention.kernel_name(trees.input_ids.device)
        threshold = self.dense_tree_max_tokens
        if threshold is None:
            threshold = DENSE_TREE_MAX_TOKENS_CUDA if kernel == "flex" else DENSE_TREE_MAX_TOKENS
        choice = kernel if self.tree_kernel and L > threshold else "dense"
        if choice not in self._logged:  # once per path and policy: which attention long trees get
            self._logged.add(choice)
            log.info(
                "shared-prompt forward: %s tree attention (%d nodes; dense up to optim.dense_tree_max_tokens=%d%s)",
                choice,
                L,
                threshold,
                "" if self.tree_kernel else ", the block kernel needs SDPA attention",
            )
        self.last_tree_attention = choice
        if choice != "dense":
            return tree_attention.tree_ends_mask(trees.subtree_end)
        return trees.attention_mask(eager=self.lm.config._attn_implementation == "eager")

    def _tree_forward(self, trees: PackedTrees, response_mask: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.lm.get_decoder()(
            input_ids=trees.input_ids,
            attention_mask=self._tree_mask(trees),
            position_ids=trees.position_ids,
            use_cache=False,
        ).last_hidden_state
        self.last_nodes = trees.nodes
        # Each node that predicts a token goes through the head once, however many rows share it.
        nodes, rows = torch.unique(trees.source, return_inverse=True)
        head = self.lm.get_output_embeddings()
        lp, ent = chunked_head_logprobs(
            hidden.reshape(-1, hidden.shape[-1])[nodes],
            head.weight,
            head.bias,
            trees.targets,
            self.chunk_tokens,
            self.inv_temperature,
            rows=rows,
        )
        select = response_mask.bool()
        return lp.new_zeros(select.shape).masked_scatter(select, lp), ent.new_zeros(
            select.shape
        ).masked_scatter(select, ent)
