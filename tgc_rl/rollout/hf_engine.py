"""A transformers engine behind the RolloutEngine interface, for machines without vLLM.

Decoding is a plain KV-cached loop over a transformers causal LM so that every sample draws from its own
torch.Generator: a sample's tokens depend on its seed only, not on which other prompts share its batch.
The sampling log-prob of a token is log_softmax of the processed scores (temperature, then top-p), the
distribution it was drawn from, as vLLM reports with `logprobs_mode="processed_logprobs"`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tgc_rl.batch import Completion
from tgc_rl.config import resolve_dtype
from tgc_rl.models import load_tokenizer
from tgc_rl.rollout.engine import RolloutEngine, Sampling, check_requests, prompt_lengths, sample_seed
from tgc_rl.rollout.spec import RolloutSpec
from tgc_rl.weight_sync.flat import Weights, named_tensors


def top_p_mask(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Scores with every token outside the nucleus of mass `top_p` set to -inf (the top token always stays)."""
    if top_p >= 1.0:
        return scores
    sorted_scores, order = scores.sort(dim=-1, descending=True)
    probs = sorted_scores.softmax(dim=-1)
    outside = probs.cumsum(dim=-1) - probs > top_p  # mass before this token already covers top_p
    return scores.masked_fill(outside.scatter(-1, order, outside), float("-inf"))


class HFEngine(RolloutEngine):
    def __init__(self, spec: RolloutSpec, model_path: Path | str, batch_rows: int = 64):
        from transformers import AutoModelForCausalLM

        self.spec = spec
        self.version = 0
        self.batch_rows = batch_rows  # sequences decoded together (bounds KV-cache memory)
        tok = load_tokenizer(spec.model)
        self.eos_id, self.pad_id = int(tok.eos_token_id), int(tok.pad_token_id)
        dtype = getattr(torch, resolve_dtype(spec.model.dtype, on_gpu=torch.cuda.is_available()))
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval()
        self.model.requires_grad_(False)

    # -- generation -------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], n: int, seeds: list[int], sampling: Sampling | None = None
    ) -> list[list[Completion]]:
        check_requests(prompts, n, seeds, self.spec.sampling.max_prompt_tokens)
        rows = [(p, sample_seed(seed, j)) for p, seed in zip(prompts, seeds, strict=True) for j in range(n)]
        # similar lengths together: less padding per batch
        order = sorted(range(len(rows)), key=lambda r: len(rows[r][0]))
        done: list[Completion | None] = [None] * len(rows)
        for start in range(0, len(order), self.batch_rows):
            chunk = order[start : start + self.batch_rows]
            for r, comp in zip(chunk, self._decode([rows[r] for r in chunk], sampling), strict=True):
                done[r] = comp
        return [done[i * n : (i + 1) * n] for i in range(len(prompts))]  # type: ignore[misc]

    def _decode(
        self, rows: list[tuple[list[int], int]], sampling: Sampling | None = None
    ) -> list[Completion]:
        s = sampling or self.spec.sampling
        greedy = s.temperature == 0
        B, P = len(rows), max(len(p) for p, _ in rows)
        ids = torch.full((B, P), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, P), dtype=torch.long)
        for b, (p, _) in enumerate(rows):
            ids[b, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[b, P - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        gens = [torch.Generator().manual_seed(seed) for _, seed in rows]
        tokens: list[list[int]] = [[] for _ in rows]
        logps: list[list[float]] = [[] for _ in rows]
        finished = [False] * B
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        for step in range(s.max_new_tokens):
            scores = top_p_mask(out.logits[:, -1, :].float() / (s.temperature or 1.0), s.top_p)
            logp = scores.log_softmax(dim=-1)
            probs = logp.exp()
            nxt = torch.full((B,), self.pad_id, dtype=torch.long)
            for b in range(B):
                if finished[b]:
                    continue
                tok = (
                    int(probs[b].argmax())
                    if greedy
                    else int(torch.multinomial(probs[b], 1, generator=gens[b]))
                )
                nxt[b] = tok
                tokens[b].append(tok)
                logps[b].append(float(logp[b, tok]))
                finished[b] = tok == self.eos_id
            if all(finished) or step == s.max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long)], dim=1)
            pos = pos[:, -1:] + 1
            out = self.model(
                input_ids=nxt[:, None],
                attention_mask=mask,
                position_ids=pos,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
        return [
            Completion(t, lp, "stop" if f else "length", self.version)
            for t, lp, f in zip(tokens, logps, finished, strict=True)
        ]

    # -- weights ------------------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, weights: Weights, version: int) -> float:
        t0 = time.perf_counter()
        params = dict(self.model.named_parameters())  # tied weights appear once
        loaded: set[str] = set()
        unknown: list[str] = []
        for name, tensor in named_tensors(weights):
            p = params.get(name)
            if p is None:
                if name not in self.model.state_dict():  # e.g. lm_head.weight of a tied model is fine
                    unknown.append(name)
                continue
            if p.shape != tensor.shape:
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(tensor.shape)}, the engine's model "
                    f"{tuple(p.shape)}; publish the full (unsharded) state dict of the same model"
                )
            p.copy_(tensor)
            loaded.add(name)
        missing = sorted(set(params) - loaded)
        if unknown or missing:
            raise ValueError(
                f"update_weights: the weights do not match the engine's model (unknown: "
                f"{unknown[:5]}, missing: {missing[:5]}); publish the learner's full state dict "
                "with Hugging Face parameter names"
            )
        self.version = int(version)
        return time.perf_counter() - t0

    @torch.no_grad()
    def score(self, sequences: list[list[int]], prompt_len: int | list[int]) -> list[list[float]]:
        lens = prompt_lengths(sequences, prompt_len)
        result: list[list[float]] = []
        for seq, p in zip(sequences, lens, strict=True):
            ids = torch.tensor([seq], dtype=torch.long)
            # only the positions that predict response tokens: the (T x vocab) logits of the prompt never exist
            logits = self.model(input_ids=ids, logits_to_keep=len(seq) - p + 1).logits[0, :-1]
            logp = logits.float().log_softmax(dim=-1)
            result.append(logp.gather(-1, ids[0, p:, None])[:, 0].tolist())
        return result

    def close(self) -> None:
        self.model = None
