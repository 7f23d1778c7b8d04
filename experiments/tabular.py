"""Testbed 1: the tabular cancellation toy, trained with rlcore's objectives (docs/objectives.md#the-tabular-toy).

One autoregressive "response" per sample, built from slots whose logits are tied tabular parameters (tied:
every copy of a slot token sits at an identical context, so cancellation is exact and checkable):

    slot 0 template  T1..T4, init p(T1) = template_p   reward-irrelevant, usually group-common
    slot 1 opener    O1, O2, init .5/.5                 reward-irrelevant
    slot 2 decision  R1, R2, W per prompt; P(correct) from .01 to .60 over the prompts; reward 1 iff R1/R2
    slot 3 style     concise, verbose, init .5          reward-irrelevant; verbose adds `verbose_extra` fillers
    slot 4 filler    F1..F3, tied over positions       high-frequency weak-credit tokens
    length = 4 + (fill_ok if correct else fill_bad) + (verbose_extra if verbose)

Wrong answers ramble (fill_bad > fill_ok) and the verbose style lengthens a response without changing its
reward, so an objective whose per-token coefficient depends on the response's length moves P(verbose) although
it earns nothing. Each step samples `prompts_per_step` prompts x `group_size` responses and updates the logits
with Adam (or SGD) for `epochs` passes per Lopti stage. The loss, the advantages, the Lopti stages and the
diagnostics are rlcore's; this module adds optimizer steps that see part of a rollout batch (groups kept whole
or split across them, docs/objectives.md#step-constant-normalisers), per-token entropies for D7, and traces of
every metric over training.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

import rlcore
from experiments.diag import defined
from experiments.minibatches import minibatch_rows, split_sequence_weights
from rlcore.diagnostics import ascent_weights, cancellation_diagnostics

_OFFSETS = (0, 4, 6, 9, 11)  # token-id offsets of the slots (4, 2, 3, 2, 3 tokens) in one vocabulary
PAD_ID = 14


@dataclass(frozen=True)
class ToyConfig:
    """The toy's environment and optimizer (defaults: the main setting of testbed 1)."""

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
    diag_every: int = 1  # diagnostics on every k-th gradient step (they dominate the toy's tiny steps)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "group_size", "epochs", "n_prompts", "diag_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"ToyConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(
                f"ToyConfig.group_size must be >= 2 (group-relative advantages), got {self.group_size}"
            )
        if self.prompts_per_step > self.n_prompts:
            raise ValueError(
                f"ToyConfig.prompts_per_step ({self.prompts_per_step}) exceeds n_prompts ({self.n_prompts})"
            )
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"ToyConfig.optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if not 0 < self.template_p < 1:
            raise ValueError(f"ToyConfig.template_p must be in (0, 1), got {self.template_p}")

    @property
    def max_len(self) -> int:
        return 4 + max(self.fill_ok, self.fill_bad) + self.verbose_extra


class TabularPolicy(torch.nn.Module):
    """Tied per-slot logits; the decision slot has one row per prompt."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        pc = torch.exp(torch.linspace(math.log(0.01), math.log(0.6), cfg.n_prompts, dtype=torch.float64))
        rest = (1 - cfg.template_p) / 3
        self.template = torch.nn.Parameter(
            torch.log(torch.tensor([cfg.template_p, rest, rest, rest], dtype=torch.float64))
        )
        self.opener = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.decision = torch.nn.Parameter(torch.log(torch.stack([pc / 2, pc / 2, 1 - pc], 1)))
        self.style = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.filler = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))

    def slot_logprobs(self, prompt: Tensor) -> list[Tensor]:
        ls = torch.log_softmax
        return [
            ls(self.template, 0),
            ls(self.opener, 0),
            ls(self.decision[prompt], 1),
            ls(self.style, 0),
            ls(self.filler, 0),
        ]


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
        filler = torch.multinomial(probs[4], n * (cfg.max_len - 4), replacement=True, generator=gen).view(
            n, -1
        )
    correct = slot_tokens[:, 2] < 2
    n_fill = torch.where(correct, cfg.fill_ok, cfg.fill_bad) + torch.where(
        slot_tokens[:, 3] == 1, cfg.verbose_extra, 0
    )
    mask = torch.arange(cfg.max_len)[None, :] < (4 + n_fill)[:, None]
    ids = torch.cat([slot_tokens + torch.tensor(_OFFSETS[:4]), filler + _OFFSETS[4]], 1)
    return ToyBatch(
        prompt=prompt,
        slot_tokens=slot_tokens,
        filler=filler,
        mask=mask,
        token_ids=torch.where(mask, ids, PAD_ID),
        rewards=correct.to(torch.float64),
        group_ids=torch.arange(n) // g,
    )


def logprobs(policy: TabularPolicy, batch: ToyBatch) -> Tensor:
    """(N, T) log-probs of the sampled tokens (0 on padding)."""
    lps = policy.slot_logprobs(batch.prompt)
    st = batch.slot_tokens
    cols = [lps[0][st[:, 0]], lps[1][st[:, 1]], lps[2].gather(1, st[:, 2:3])[:, 0], lps[3][st[:, 3]]]
    lp = torch.cat([torch.stack(cols, 1), lps[4][batch.filler]], 1)
    return lp * batch.mask


TRACE_KEYS = (
    "success",
    "p_verbose",
    "template_drift",
    "template_entropy",
    "opener_logodds",
    "filler_entropy",
    "solution_logodds",
)


@dataclass(frozen=True)
class TabularRun:
    objective: str
    overrides: dict[str, Any] = field(default_factory=dict)
    toy: ToyConfig = field(default_factory=ToyConfig)
    mini_batches: int = 1
    split_groups: bool = False
    trace_every: int = 10
    threshold: float = 0.75

    def __post_init__(self) -> None:
        if self.mini_batches < 1:
            raise ValueError(f"TabularRun.mini_batches must be >= 1, got {self.mini_batches}")
        if self.split_groups and (self.mini_batches < 2 or self.toy.group_size % self.mini_batches):
            raise ValueError(
                f"TabularRun: split_groups needs mini_batches >= 2 dividing group_size "
                f"({self.toy.group_size}); got mini_batches={self.mini_batches}"
            )
        if not self.split_groups and self.toy.prompts_per_step % self.mini_batches:
            raise ValueError(
                f"TabularRun: prompts_per_step ({self.toy.prompts_per_step}) must be a multiple of "
                f"mini_batches ({self.mini_batches}) to keep groups whole"
            )

    def with_seed(self, seed: int) -> TabularRun:
        return replace(self, toy=replace(self.toy, seed=seed))


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits, -1)
    return -(lp.exp() * lp).sum(-1)


def token_entropies(policy: TabularPolicy, batch: ToyBatch) -> torch.Tensor:
    """(N, T) entropy of the slot distribution each sampled token was drawn from (for D7)."""
    with torch.no_grad():
        n, width = batch.mask.shape
        head = torch.stack(
            [
                _entropy(policy.template).expand(n),
                _entropy(policy.opener).expand(n),
                _entropy(policy.decision[batch.prompt]),
                _entropy(policy.style).expand(n),
            ],
            1,
        )
        fill = _entropy(policy.filler).expand(n, width - 4)
        return torch.cat([head, fill], 1) * batch.mask


def snapshot(policy: TabularPolicy, cfg: ToyConfig) -> dict[str, float]:
    """The toy's metrics of the current policy: success (mean P(correct)), p_verbose [.5], template_drift
    (|log-odds change| of T1) [0], template_entropy, opener_logodds [0], filler_entropy [ln 3],
    solution_logodds (mean |log p(R1)/p(R2)|) [0]; initial values in brackets."""
    with torch.no_grad():
        tmpl = torch.softmax(policy.template, 0)
        dec = torch.softmax(policy.decision, 1)
        opener = torch.softmax(policy.opener, 0)[0]
        init_lo = math.log(cfg.template_p / (1 - cfg.template_p))
        return {
            "success": float((dec[:, 0] + dec[:, 1]).mean()),
            "p_verbose": float(torch.softmax(policy.style, 0)[1]),
            "template_drift": abs(float(torch.log(tmpl[0] / (1 - tmpl[0]))) - init_lo),
            "template_entropy": float(_entropy(policy.template)),
            "opener_logodds": abs(float(torch.log(opener / (1 - opener)))),
            "filler_entropy": float(_entropy(policy.filler)),
            "solution_logodds": float(torch.log(dec[:, 0] / dec[:, 1]).abs().mean()),
        }


def run(spec: TabularRun) -> dict[str, Any]:
    """One training run; returns {config, trace_steps, curves, final, seconds} (JSON-ready).

    Runs single-threaded (restored afterwards): the toy's tensors are tiny, and intra-op threads on a busy
    machine made it ~10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(spec)
    finally:
        torch.set_num_threads(threads)


def _run(spec: TabularRun) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = spec.toy
    objective = rlcore.get_objective(spec.objective, **spec.overrides)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)  # the rollout stream
    deal = torch.Generator().manual_seed(7_919 + cfg.seed)  # mini-batch assignment only
    policy = TabularPolicy(cfg)
    params = list(policy.parameters())
    opt = (
        torch.optim.Adam(params, lr=cfg.lr) if cfg.optimizer == "adam" else torch.optim.SGD(params, lr=cfg.lr)
    )
    g, n_groups = cfg.group_size, cfg.prompts_per_step
    trace_steps, curves = [0], {key: [val] for key, val in snapshot(policy, cfg).items()}
    diag_sums: dict[str, list[float]] = {}
    interval: dict[str, list[float]] = {}
    diag_keys: set[str] = set()
    success_hist: list[float] = []
    grad_steps = 0
    for step in range(1, cfg.steps + 1):
        batch = sample(policy, cfg, gen)
        with torch.no_grad():
            old = logprobs(policy, batch)
        ent = token_entropies(policy, batch)
        adv = objective.advantages(batch.rewards, batch.group_ids, batch.mask)
        for stage in objective.stages(old, batch.mask):
            for _ in range(cfg.epochs):
                parts = (
                    [torch.arange(n_groups * g)]
                    if spec.mini_batches == 1
                    else minibatch_rows(n_groups, g, spec.mini_batches, spec.split_groups, deal)
                )
                for rows in parts:
                    kwargs: dict[str, Any] = {"stage_mask": stage[rows]}
                    if spec.mini_batches > 1:  # each optimizer step normalises by its own totals
                        kwargs["step"] = rlcore.StepNorm.from_mask(
                            batch.mask[rows], group_size=None if spec.split_groups else g
                        )
                        if objective.needs_whole_groups and spec.split_groups:
                            with torch.no_grad():
                                current = logprobs(policy, batch)
                            kwargs["seq_weights"] = split_sequence_weights(
                                objective, current, old, adv, batch.mask, batch.group_ids, rows
                            )
                    lp = logprobs(policy, batch)[rows] if spec.mini_batches > 1 else logprobs(policy, batch)
                    w, out = ascent_weights(
                        objective,
                        lp,
                        old[rows],
                        adv[rows],
                        batch.mask[rows],
                        batch.group_ids[rows],
                        of="loss",
                        **kwargs,
                    )
                    grad_steps += 1
                    if grad_steps % cfg.diag_every == 0:
                        diag = defined(
                            cancellation_diagnostics(
                                w,
                                batch.token_ids[rows],
                                batch.mask[rows],
                                batch.group_ids[rows],
                                adv[rows],
                                entropies=ent[rows],
                                group_size=g,
                                clipped=out.clipped,
                            )
                        )
                        for key, val in diag.items():
                            diag_sums.setdefault(key, []).append(val)
                            interval.setdefault(key, []).append(val)
                    opt.zero_grad(set_to_none=True)
                    lp.backward(-w)
                    opt.step()
        snap = snapshot(policy, cfg)
        success_hist.append(snap["success"])
        if step % spec.trace_every == 0 or step == cfg.steps:
            trace_steps.append(step)
            for key, val in snap.items():
                curves[key].append(val)
            diag_keys.update(interval)
            for key in diag_keys:  # one value per interval; NaN where a statistic was never defined in it
                vals = interval.get(key, [])
                curves.setdefault(key, [float("nan")] * (len(trace_steps) - 2)).append(
                    float(np.mean(vals)) if vals else float("nan")
                )
            interval = {}
    final = dict(snapshot(policy, cfg))
    final.update({key: float(np.mean(vals)) for key, vals in diag_sums.items()})
    final["cancel_resid"] = final.get("diag/d1_gcpr", float("nan"))  # NaN: no step had a common prefix
    hit = [i for i, s in enumerate(success_hist) if s >= spec.threshold]
    final["t75"] = float(hit[0] if hit else cfg.steps)  # `steps` if never reached (censored at the budget)
    return {
        "config": _config_dict(spec),
        "trace_steps": trace_steps,
        "curves": curves,
        "final": final,
        "seconds": time.perf_counter() - t0,
    }


def _config_dict(spec: TabularRun) -> dict[str, Any]:
    d = asdict(spec)
    d["toy"] = asdict(spec.toy)
    return d
