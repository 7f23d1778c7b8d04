"""The tiny LM as a policy over the task grammar: sampling, per-token log-probs and entropies.

The policy's distribution at each response position is the model's softmax restricted to the tokens the
grammar allows there (constrained decoding), so every sampled response is well formed and the entropy of a
slot is over its own choices (ln 4 for the template, ln 2 for style, ...), as in the tabular toy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from experiments.tinylm.model import TinyLM
from experiments.tinylm.task import (
    ANSWER,
    CONCISE,
    EOS,
    MAX_RESPONSE,
    OPENER,
    PAD,
    PROMPT_LEN,
    TEMPLATE,
    VERBOSE,
    SyntheticTask,
)

NEG = -1e9  # logit of a token the grammar forbids (finite: keeps 0 * -inf NaNs out of entropies)


@dataclass
class Rollout:
    """One batch of sampled responses, groups contiguous (rows g*G .. g*G+G-1 share a prompt)."""

    prompt_ids: torch.Tensor  # (N,)
    tokens: torch.Tensor  # (N, PROMPT_LEN + W), PAD after EOS, W <= MAX_RESPONSE the longest response
    mask: torch.Tensor  # (N, W) float, 1 on response tokens (EOS included)
    logprobs: torch.Tensor  # (N, W) log pi_old of the sampled tokens
    entropies: torch.Tensor  # (N, W) entropy of pi_old at each response position
    rewards: torch.Tensor  # (N,)
    group_ids: torch.Tensor  # (N,)

    @property
    def responses(self) -> torch.Tensor:
        return self.tokens[:, PROMPT_LEN:]

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(1)

    @property
    def verbose(self) -> torch.Tensor:
        return (self.responses[:, 3] == VERBOSE).float()


def masked_logits(model: TinyLM, task: SyntheticTask, tokens: torch.Tensor) -> torch.Tensor:
    """Grammar-restricted logits (N, MAX_RESPONSE, V) predicting each response token."""
    logits = model(tokens[:, :-1])[:, PROMPT_LEN - 1 :]
    return logits.masked_fill(~task.allowed[: logits.shape[1]], NEG)


def token_logprobs(
    model: TinyLM, task: SyntheticTask, tokens: torch.Tensor, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(y_t | h_t) of the response tokens (N, W) and optionally the entropies."""
    logp = torch.log_softmax(masked_logits(model, task, tokens), -1)
    resp = tokens[:, PROMPT_LEN:].clamp(min=0)
    lp = logp.gather(-1, resp.unsqueeze(-1)).squeeze(-1)
    ent = None
    if with_entropy:
        ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


@torch.no_grad()
def sample(
    model: TinyLM,
    task: SyntheticTask,
    prompt_ids: torch.Tensor,
    group_size: int,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> Rollout:
    """G responses for each prompt (KV-cached ancestral sampling under the grammar)."""
    pid = prompt_ids.repeat_interleave(group_size)
    n = pid.numel()
    tokens = torch.full((n, PROMPT_LEN + MAX_RESPONSE), PAD, dtype=torch.long)
    tokens[:, :PROMPT_LEN] = task.prompt_tokens(pid)
    caches: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    logits = model(tokens[:, :PROMPT_LEN], caches, 0)[:, -1]
    done = torch.zeros(n, dtype=torch.bool)
    for j in range(MAX_RESPONSE):
        z = logits.masked_fill(~task.allowed[j], NEG) / temperature
        nxt = torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
        tokens[:, PROMPT_LEN + j] = nxt
        done = done | (nxt == EOS)
        if bool(done.all()):
            break
        logits = model(nxt.unsqueeze(1), caches, PROMPT_LEN + j)[:, -1]
    width = int((tokens[:, PROMPT_LEN:] != PAD).sum(1).max())
    tokens = tokens[:, : PROMPT_LEN + width]  # trim the padding no response reached
    mask = (tokens[:, PROMPT_LEN:] != PAD).float()
    # Old log-probs from one full forward (not from the cache), so that the first ratio is exactly 1.
    lp, ent = token_logprobs(model, task, tokens, with_entropy=True)
    rewards = task.is_correct(pid, tokens[:, PROMPT_LEN + 2])
    groups = torch.arange(prompt_ids.numel()).repeat_interleave(group_size)
    return Rollout(pid, tokens, mask, lp * mask, ent * mask, rewards, groups)


@torch.no_grad()
def head_distributions(model: TinyLM, task: SyntheticTask) -> dict[str, torch.Tensor]:
    """Exact distributions of the first four slots for every prompt, by enumerating their prefixes.

    Returns per prompt k: p_template (K, 4); p_opener (K, 4, 2) given each template; p_answer (K, 4, 2, 8)
    given template/opener; p_verbose (K, 4, 2, 8) given template/opener/answer.
    """
    k = task.cfg.n_prompts
    pid = torch.arange(k)
    prefix = task.prompt_tokens(pid)
    combos = torch.cartesian_prod(torch.arange(4), torch.arange(2), torch.arange(len(ANSWER)))  # (64, 3)
    tok = torch.cat(
        [
            prefix.repeat_interleave(len(combos), 0),
            torch.stack([combos[:, 0] + 3, combos[:, 1] + 7, combos[:, 2] + ANSWER[0]], 1).repeat(k, 1),
        ],
        1,
    )
    logits = model(tok)  # (K*64, 5, V): positions 1..4 predict template, opener, answer, style
    allowed = task.allowed

    def dist(pos: int, slot: int, ids: list[int]) -> torch.Tensor:
        z = logits[:, pos].masked_fill(~allowed[slot], NEG)
        return torch.softmax(z, -1)[:, ids]

    p_t = dist(1, 0, list(TEMPLATE)).view(k, 4, 2, 8, 4)[:, 0, 0, 0]
    p_o = dist(2, 1, list(OPENER)).view(k, 4, 2, 8, 2)[:, :, 0, 0]
    p_a = dist(3, 2, list(ANSWER)).view(k, 4, 2, 8, 8)[:, :, :, 0]
    p_v = dist(4, 3, [CONCISE, VERBOSE]).view(k, 4, 2, 8, 2)[..., 1]
    return {"p_template": p_t, "p_opener": p_o, "p_answer": p_a, "p_verbose": p_v}
