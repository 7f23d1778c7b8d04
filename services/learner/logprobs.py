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

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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


def _forward_chunks(hidden, weight, bias, targets, chunk, inv_temperature) -> tuple[Tensor, Tensor]:
    n = hidden.shape[0]
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    logp = torch.empty(n, dtype=dtype, device=hidden.device)
    ent = torch.empty(n, dtype=dtype, device=hidden.device)
    for s in range(0, n, chunk):
        lp = _chunk_logprobs(hidden[s:s + chunk], weight, bias, inv_temperature)
        logp[s:s + chunk] = lp.gather(-1, targets[s:s + chunk, None]).squeeze(-1)
        ent[s:s + chunk] = -(lp.exp().mul_(lp)).sum(-1)
    return logp, ent


class _ChunkedHead(torch.autograd.Function):
    """Head + log_softmax + gather + entropy whose backward recomputes each chunk's logits and turns them
    into d(loss)/d(logits) in place: at most ~2 chunk-sized buffers live at any time, in either pass.

    With log p = z - lse (z = logits / temperature), p = exp(log p) and H = -sum p log p:
        d log p_y / dz = onehot(y) - p,    dH / dz = -p (log p + H)
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, inv_temperature):
        logp, ent = _forward_chunks(hidden, weight, bias, targets, chunk, inv_temperature)
        ctx.save_for_backward(hidden, weight, bias, targets, ent)
        ctx.chunk, ctx.inv_temperature = chunk, inv_temperature
        ctx.set_materialize_grads(False)  # an unused output (usually the entropy) arrives as None: skip its terms
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, targets, ent = ctx.saved_tensors
        chunk, inv_t = ctx.chunk, ctx.inv_temperature
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(weight.dtype, torch.float32)  # bf16 weights: accumulate chunks in fp32
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        for s in range(0, hidden.shape[0], chunk):
            h, t = hidden[s:s + chunk], targets[s:s + chunk]
            lp = _chunk_logprobs(h, weight, bias, inv_t)
            p = lp.exp()
            g = lp  # reuse the buffer: g = -p * (g_ent * (log p + H) + g_logp), then + g_logp at the target
            if g_ent is not None:
                g.add_(ent[s:s + chunk, None]).mul_(g_ent[s:s + chunk, None])
            else:
                g.zero_()
            if g_logp is not None:
                g.add_(g_logp[s:s + chunk, None])
            g.mul_(p).neg_()
            del p
            if g_logp is not None:
                g.scatter_add_(-1, t[:, None], g_logp[s:s + chunk, None].to(g.dtype))
            if inv_t != 1.0:
                g.mul_(inv_t)
            g = g.to(weight.dtype)
            if need_h:
                grad_h[s:s + chunk] = g @ weight
            if need_w:
                grad_w.add_(g.T @ h)
            if need_b:
                grad_b.add_(g.sum(0))
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None


def chunked_head_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                          chunk_tokens: int, inv_temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """log p(target) and the entropy of the full distribution for (N, H) hidden states, `chunk_tokens`
    rows at a time, forward and backward: the (N x vocab) logits never exist whole."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedHead.apply(hidden, weight, bias, targets, chunk_tokens, inv_temperature)
    return _forward_chunks(hidden, weight, bias, targets, chunk_tokens, inv_temperature)


class PolicyLogprobs(nn.Module):
    """`forward(input_ids, attention_mask, prompt_len, response_mask) -> (logprobs, entropies)`, both (B, T)
    with zeros off the response mask. Only masked tokens go through the head (no work on padding)."""

    def __init__(self, lm: nn.Module, chunk_tokens: int, temperature: float = 1.0):
        super().__init__()
        if chunk_tokens < 1:
            raise ValueError(f"optim.logprob_chunk_tokens must be >= 1, got {chunk_tokens}")
        if temperature <= 0:
            raise ValueError(f"sampling.temperature must be > 0, got {temperature}")
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        self.inv_temperature = 1.0 / temperature  # the sampling policy is softmax(logits / temperature)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int,
                response_mask: Tensor) -> tuple[Tensor, Tensor]:
        if prompt_len < 1:
            raise ValueError("prompt_len must be >= 1: the first response token is predicted from the prompt")
        body = self.lm.get_decoder()
        hidden = body(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids(attention_mask), use_cache=False).last_hidden_state
        # Column prompt_len + t (response token t) is predicted by the hidden state of column prompt_len + t - 1.
        hidden = hidden[:, prompt_len - 1:-1]
        targets = input_ids[:, prompt_len:]
        select = response_mask.bool()
        empty = not bool(select.any())
        if empty:
            # Still route one token through the head so every parameter gets a (zero) gradient: FSDP ranks
            # must reduce-scatter the same set of gradients.
            select = torch.zeros_like(select)
            select[0, 0] = True
        head = self.lm.get_output_embeddings()
        lp, ent = chunked_head_logprobs(hidden[select], head.weight, head.bias, targets[select],
                                        self.chunk_tokens, self.inv_temperature)
        if empty:
            lp, ent = lp * 0.0, ent * 0.0
        logprobs = lp.new_zeros(select.shape).masked_scatter(select, lp)
        entropies = ent.new_zeros(select.shape).masked_scatter(select, ent)
        return logprobs, entropies
