"""Tabular-softmax cancellation toy (objectives.md sec. 9), driven by rlcore's own objectives.

A torch port of `research/cancellation_toy.py`: one autoregressive "response" per sample, built from
slots whose logits are tied tabular parameters (tied = identical context for every copy, so
cancellation is exact and checkable):

    slot 0 template  T1..T4, init p(T1) = template_p   reward-irrelevant, usually group-common
    slot 1 opener    O1, O2, init .5/.5                 reward-irrelevant
    slot 2 decision  R1, R2, W per prompt; P(correct) from .01 to .60 over the prompts; reward 1 iff R1/R2
    slot 3 style     concise, verbose, init .5          reward-irrelevant; verbose adds `verbose_extra` fillers
    slot 4 filler    F1..F3, tied over positions       high-frequency weak-credit tokens
    length = 4 + (fill_ok if correct else fill_bad) + (verbose_extra if verbose)

Each step samples `prompts_per_step` prompts x `group_size` responses, computes the (B, T) log-prob
tensor of the sampled tokens, and updates the logits with Adam on `objective.loss` for `epochs` passes
(per Lopti stage). D1 is read from the same loss via `ascent_weights` (the loss is evaluated once).
Pure torch, no I/O: experiments call `run_toy` and write results themselves.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from rlcore.diagnostics import ascent_weights, cancellation_diagnostics

SLOTS = (4, 2, 3, 2, 3)  # template, opener, decision, style, filler
_OFFSETS = (0, 4, 6, 9, 11)  # token-id offsets of each slot in the shared vocabulary
PAD_ID = 14


@dataclass(frozen=True)
class ToyConfig:
    steps: int = 400
    prompts_per_step: int = 32
    group_size: int = 8
    epochs: int = 4
    lr: float = 0.01
    optimizer: str = "adam"  # or "sgd" (plain ascent on the loss, lr is then objective-scale dependent)
    template_p: float = 0.91
    n_prompts: int = 256
    fill_ok: int = 4
    fill_bad: int = 12
    verbose_extra: int = 8
    seed: int = 0
    diag_every: int = 1  # D1 on every k-th gradient step (diagnostics dominate the toy's tiny steps)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "group_size", "epochs", "n_prompts", "diag_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"ToyConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"ToyConfig.group_size must be >= 2 (group-relative advantages), got {self.group_size}")
        if self.prompts_per_step > self.n_prompts:
            raise ValueError(f"ToyConfig.prompts_per_step ({self.prompts_per_step}) exceeds n_prompts ({self.n_prompts})")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"ToyConfig.optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if not 0 < self.template_p < 1:
            raise ValueError(f"ToyConfig.template_p must be in (0, 1), got {self.template_p}")

    @property
    def max_len(self) -> int:
        return 4 + max(self.fill_ok, self.fill_bad) + self.verbose_extra


@dataclass
class ToyResult:
    """Final values after `steps` (init in brackets): success (mean P(correct)), t75 (first step with
    success >= .75, `steps` if never), p_verbose [.5], template_drift (|log-odds change| of T1 [0]),
    filler_entropy [ln 3], opener_logodds [0], solution_logodds (mean |log p(R1)/p(R2)|) [0],
    cancel_resid (mean D1 over all gradient steps) and per-step histories of success and p_verbose."""

    success: float
    t75: int
    p_verbose: float
    template_drift: float
    filler_entropy: float
    opener_logodds: float
    solution_logodds: float
    cancel_resid: float
    success_history: list[float] = field(default_factory=list)
    p_verbose_history: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class TabularPolicy(torch.nn.Module):
    """Tied per-slot logits; the decision slot has one row per prompt."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        pc = torch.exp(torch.linspace(math.log(0.01), math.log(0.6), cfg.n_prompts, dtype=torch.float64))
        rest = (1 - cfg.template_p) / 3
        self.template = torch.nn.Parameter(torch.log(torch.tensor([cfg.template_p, rest, rest, rest],
                                                                  dtype=torch.float64)))
        self.opener = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.decision = torch.nn.Parameter(torch.log(torch.stack([pc / 2, pc / 2, 1 - pc], 1)))
        self.style = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.filler = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))

    def slot_logprobs(self, prompt: Tensor) -> list[Tensor]:
        ls = torch.log_softmax
        return [ls(self.template, 0), ls(self.opener, 0), ls(self.decision[prompt], 1), ls(self.style, 0),
                ls(self.filler, 0)]


@dataclass(frozen=True)
class ToyBatch:
    prompt: Tensor  # (N,) prompt of each response
    slot_tokens: Tensor  # (N, 4) sampled template/opener/decision/style indices
    filler: Tensor  # (N, T-4) filler indices (padding beyond the length is ignored)
    mask: Tensor  # (N, T) bool
    token_ids: Tensor  # (N, T) ids in the shared vocabulary, PAD_ID outside the mask
    rewards: Tensor  # (N,)
    group_ids: Tensor  # (N,)


def sample(policy: TabularPolicy, cfg: ToyConfig, gen: torch.Generator) -> ToyBatch:
    """One rollout batch: `prompts_per_step` distinct prompts x `group_size` responses."""
    g, n = cfg.group_size, cfg.prompts_per_step * cfg.group_size
    with torch.no_grad():
        prompt = torch.randperm(cfg.n_prompts, generator=gen)[: cfg.prompts_per_step].repeat_interleave(g)
        probs = [lp.exp() for lp in policy.slot_logprobs(prompt)]
        toks = []
        for k in range(4):
            p = probs[k] if probs[k].ndim == 2 else probs[k].expand(n, -1)
            toks.append(torch.multinomial(p, 1, generator=gen)[:, 0])
        slot_tokens = torch.stack(toks, 1)
        filler = torch.multinomial(probs[4], n * (cfg.max_len - 4), replacement=True, generator=gen).view(n, -1)
    correct = slot_tokens[:, 2] < 2
    n_fill = torch.where(correct, cfg.fill_ok, cfg.fill_bad) + torch.where(slot_tokens[:, 3] == 1, cfg.verbose_extra, 0)
    mask = torch.arange(cfg.max_len)[None, :] < (4 + n_fill)[:, None]
    ids = torch.cat([slot_tokens + torch.tensor(_OFFSETS[:4]), filler + _OFFSETS[4]], 1)
    return ToyBatch(prompt=prompt, slot_tokens=slot_tokens, filler=filler, mask=mask,
                    token_ids=torch.where(mask, ids, PAD_ID), rewards=correct.to(torch.float64),
                    group_ids=torch.arange(n) // g)


def logprobs(policy: TabularPolicy, batch: ToyBatch) -> Tensor:
    """(N, T) log-probs of the sampled tokens (0 on padding)."""
    lps = policy.slot_logprobs(batch.prompt)
    st = batch.slot_tokens
    cols = [lps[0][st[:, 0]], lps[1][st[:, 1]], lps[2].gather(1, st[:, 2:3])[:, 0], lps[3][st[:, 3]]]
    lp = torch.cat([torch.stack(cols, 1), lps[4][batch.filler]], 1)
    return lp * batch.mask


def run_toy(objective, cfg: ToyConfig = ToyConfig()) -> ToyResult:  # noqa: B008 - frozen default
    """Train the tabular policy with `objective` (an rlcore Objective) and report the sec. 9 metrics.

    Runs single-threaded (restored afterwards): the toy's tensors are tiny, and intra-op threads on a
    busy machine made it ~10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(objective, cfg)
    finally:
        torch.set_num_threads(threads)


def _run(objective, cfg: ToyConfig) -> ToyResult:
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    policy = TabularPolicy(cfg)
    params = list(policy.parameters())
    opt = (torch.optim.Adam(params, lr=cfg.lr) if cfg.optimizer == "adam"
           else torch.optim.SGD(params, lr=cfg.lr))
    success, p_verb, resid = [], [], []
    grad_steps = 0
    for _ in range(cfg.steps):
        batch = sample(policy, cfg, gen)
        with torch.no_grad():
            old = logprobs(policy, batch)
        adv = objective.advantages(batch.rewards, batch.group_ids, batch.mask)
        for stage in objective.stages(old, batch.mask):
            for _ in range(cfg.epochs):
                lp = logprobs(policy, batch)
                w, _ = ascent_weights(objective, lp, old, adv, batch.mask, batch.group_ids, of="loss",
                                      stage_mask=stage)
                grad_steps += 1
                if grad_steps % cfg.diag_every == 0:
                    diag = cancellation_diagnostics(w, batch.token_ids, batch.mask, batch.group_ids, adv)
                    if diag["diag/d1_groups_measured"] > 0:
                        resid.append(diag["diag/d1_gcpr"])
                opt.zero_grad(set_to_none=True)
                lp.backward(-w)  # same parameter gradient as loss.backward(), one loss evaluation
                opt.step()
        with torch.no_grad():
            dec = torch.softmax(policy.decision, 1)
            success.append(float((dec[:, 0] + dec[:, 1]).mean()))
            p_verb.append(float(torch.softmax(policy.style, 0)[1]))
    with torch.no_grad():
        tmpl = torch.softmax(policy.template, 0)[0]
        fill = torch.softmax(policy.filler, 0)
        dec = torch.softmax(policy.decision, 1)
        opener = torch.softmax(policy.opener, 0)[0]
        init_lo = math.log(cfg.template_p / (1 - cfg.template_p))
        hit = [i for i, s in enumerate(success) if s >= 0.75]
        return ToyResult(
            success=success[-1], t75=hit[0] if hit else cfg.steps, p_verbose=p_verb[-1],
            template_drift=abs(float(torch.log(tmpl / (1 - tmpl))) - init_lo),
            filler_entropy=float(-(fill * fill.log()).sum()),
            opener_logodds=abs(float(torch.log(opener / (1 - opener)))),
            solution_logodds=float(torch.log(dec[:, 0] / dec[:, 1]).abs().mean()),
            cancel_resid=sum(resid) / len(resid) if resid else 0.0,
            success_history=success, p_verbose_history=p_verb,
        )
