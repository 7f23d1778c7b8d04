"""cp_grpo with a behaviour correction on a real off-policy batch: groups sampled by one weight version of a tiny
transformer (the behaviour policy, as an async rollout replica holds it) and trained by the next (the learner's
pi_old), log-probs from the model's own forward passes. Token-level TIS keeps D2 at float rounding there,
sequence-level TIS does not (docs/objectives.md#behaviour-policy-corrections)."""

from __future__ import annotations

import pytest
import torch

import rlcore
from rlcore.config import TOKEN_CORRECTIONS
from rlcore.diagnostics import ascent_weights
from rlcore.offpolicy import behaviour_mismatch
from rlcore.shared_nodes import shared_node_residual

VOCAB, PROMPT, WIDTH, GROUPS, G = 8, 3, 6, 4, 8
STEP = 0.03  # the size of the weight change from the sampling version to the learner's


class _TinyLM(torch.nn.Module):
    """A one-block causal transformer (attention + MLP): a real forward pass, without loading a model library."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(VOCAB, width), torch.nn.Embedding(PROMPT + WIDTH, width)
        self.attn = torch.nn.MultiheadAttention(width, 2, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Linear(2 * width, width)
        )
        self.head = torch.nn.Linear(width, VOCAB)

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        n = seqs.shape[1]
        x = self.tok(seqs) + self.pos(torch.arange(n))
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)
        x = x + self.attn(x, x, x, attn_mask=causal, need_weights=False)[0]
        return self.head(x + self.mlp(x))  # logits (B, n, VOCAB)


def _model(seed: int) -> _TinyLM:
    torch.manual_seed(seed)
    model = _TinyLM().double().eval()
    with torch.no_grad():  # peaked next-token distributions: a group's responses share prefixes
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


def _logprobs(model, seqs: torch.Tensor) -> torch.Tensor:
    """log pi(token | history) of each response token of `seqs` (prompt + response), one forward of the batch."""
    with torch.no_grad():
        logits = model(seqs)[:, PROMPT - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, seqs[:, PROMPT:, None]).squeeze(-1)


def _real_off_policy_batch(seed: int):
    """Responses sampled by version v of the model (behaviour), version v + 1 (one update later) as pi_old."""
    behaviour_model = _model(seed)
    learner_model = _model(seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # an update's worth of change: k3 of the versions ~0.1-0.2, some w_t pass C = 2
        for p in learner_model.parameters():
            p.add_(STEP * torch.randn(p.shape, generator=g, dtype=p.dtype))
    prompts = torch.randint(0, VOCAB, (GROUPS, PROMPT), generator=g).repeat_interleave(G, 0)
    seqs = prompts
    with torch.no_grad():
        for _ in range(WIDTH):  # ancestral sampling from the behaviour version
            probs = torch.softmax(behaviour_model(seqs)[:, -1], -1)
            seqs = torch.cat([seqs, torch.multinomial(probs, 1, generator=g)], 1)
    beh, old = _logprobs(behaviour_model, seqs), _logprobs(learner_model, seqs)
    with torch.no_grad():  # the policy being optimised: a small step from pi_old, ratios inside the clip band
        for p in learner_model.parameters():
            p.add_(0.001 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    new = _logprobs(learner_model, seqs)
    tokens = seqs[:, PROMPT:]
    mask = torch.ones_like(tokens, dtype=torch.bool)
    gids = torch.arange(GROUPS * G) // G
    rewards = (torch.rand(GROUPS * G, generator=g) < 0.5).double()
    rewards[::G], rewards[1::G] = 1.0, 0.0
    return tokens, mask, old, new, beh, rewards, gids


def _d2(correction: str, seed: int) -> dict[str, float]:
    tokens, mask, old, new, beh, rewards, gids = _real_off_policy_batch(seed)
    obj = rlcore.get_objective("cp_grpo", behaviour_correction=correction)
    adv = obj.advantages(rewards, gids, mask)
    w, out = ascent_weights(obj, new, old, adv, mask, gids, behaviour_logprobs=beh)
    spread = behaviour_mismatch(old, beh, mask, tokens, gids)
    return {
        **shared_node_residual(w, tokens, mask, adv, gids),
        **{k: float(v) for k, v in out.metrics.items()},
        "k3": spread.k3,
        "spread_max": spread.spread_max,
    }


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("correction", TOKEN_CORRECTIONS)
def test_token_corrections_keep_d2_at_rounding_on_a_real_off_policy_batch(correction, seed):
    out = _d2(correction, seed)
    # a real lag: the versions differ, copies of a shared token agree (one version, the same forward)
    assert out["k3"] > 1e-2 and out["spread_max"] <= 1e-12
    assert out["behaviour/corrected_frac"] > 0.01  # the cap (or the band) bites on some tokens
    assert out["diag/d2_nodes"] > 10 and out["diag/d2_credit_frac"] > 0.01
    assert out["diag/d2_residual"] <= 1e-9


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("correction", ["seq_tis", "seq_geo_tis"])
def test_sequence_corrections_do_not_on_the_same_batch(correction, seed):
    assert _d2(correction, seed)["diag/d2_residual"] > 1e-3
