"""A tiny decoder-only transformer (pre-LN, learned positions), trained from scratch on CPU.

Two layers at d=64 are enough to memorise the task's per-prompt answer tables while sharing every
parameter between contexts, which is what lets a non-cancelling update spill over to unrelated
contexts (docs/objectives.md#what-cancellation-does-not-fix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    context: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig.d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})"
            )


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.h = cfg.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        if cache is not None:  # incremental decoding: attend to every cached position (all are earlier)
            if cache:
                k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
            cache[:] = [k, v]
            att = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        else:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(
        self, tokens: torch.Tensor, caches: list[list[torch.Tensor]] | None = None, start: int = 0
    ) -> torch.Tensor:
        """Logits (B, T, V). With `caches` (one list per layer), `tokens` continue a cached prefix at `start`."""
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(start, start + t))
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if caches is None else caches[i])
        return self.head(self.ln(x))
