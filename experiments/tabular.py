"""Testbed 1: the tabular cancellation toy (objectives.md sec. 9) on rlcore's objectives.

The policy, the sampler and the log-prob tensor are `rlcore.toy`'s; the loss, the advantages, the Lopti
stages and the diagnostics are rlcore's. This module only adds what a study needs on top of
`rlcore.toy.run_toy`: optimizer steps that see part of a rollout batch (groups kept whole or split
across them, objectives.md sec. 6.3), per-token entropies for D7, and traces of every metric over
training. With one mini-batch it performs exactly `run_toy`'s updates (a test checks this).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

import rlcore
from experiments.diag import defined
from experiments.minibatches import minibatch_rows, split_sequence_weights
from rlcore.diagnostics import ascent_weights, cancellation_diagnostics
from rlcore.toy import TabularPolicy, ToyBatch, ToyConfig, logprobs, sample

TRACE_KEYS = ("success", "p_verbose", "template_drift", "template_entropy", "opener_logodds", "filler_entropy",
              "solution_logodds")


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
            raise ValueError(f"TabularRun: split_groups needs mini_batches >= 2 dividing group_size "
                             f"({self.toy.group_size}); got mini_batches={self.mini_batches}")
        if not self.split_groups and self.toy.prompts_per_step % self.mini_batches:
            raise ValueError(f"TabularRun: prompts_per_step ({self.toy.prompts_per_step}) must be a multiple of "
                             f"mini_batches ({self.mini_batches}) to keep groups whole")

    def with_seed(self, seed: int) -> TabularRun:
        return replace(self, toy=replace(self.toy, seed=seed))


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits, -1)
    return -(lp.exp() * lp).sum(-1)


def token_entropies(policy: TabularPolicy, batch: ToyBatch) -> torch.Tensor:
    """(N, T) entropy of the slot distribution each sampled token was drawn from (for D7)."""
    with torch.no_grad():
        n, width = batch.mask.shape
        head = torch.stack([_entropy(policy.template).expand(n), _entropy(policy.opener).expand(n),
                            _entropy(policy.decision[batch.prompt]), _entropy(policy.style).expand(n)], 1)
        fill = _entropy(policy.filler).expand(n, width - 4)
        return torch.cat([head, fill], 1) * batch.mask


def snapshot(policy: TabularPolicy, cfg: ToyConfig) -> dict[str, float]:
    """The sec. 9 metrics of the current policy (init values: p_verbose .5, drifts 0, filler ln 3)."""
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
    """One training run; returns {config, trace_steps, curves, final, seconds} (JSON-ready)."""
    t0 = time.perf_counter()
    cfg = spec.toy
    objective = rlcore.get_objective(spec.objective, **spec.overrides)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)             # the rollout stream: identical to run_toy's
    deal = torch.Generator().manual_seed(7_919 + cfg.seed)    # mini-batch assignment only
    policy = TabularPolicy(cfg)
    params = list(policy.parameters())
    opt = torch.optim.Adam(params, lr=cfg.lr) if cfg.optimizer == "adam" else torch.optim.SGD(params, lr=cfg.lr)
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
                parts = ([torch.arange(n_groups * g)] if spec.mini_batches == 1 else
                         minibatch_rows(n_groups, g, spec.mini_batches, spec.split_groups, deal))
                for rows in parts:
                    kwargs: dict[str, Any] = {"stage_mask": stage[rows]}
                    if spec.mini_batches > 1:  # each optimizer step normalises by its own totals
                        kwargs["step"] = rlcore.StepNorm.from_mask(batch.mask[rows],
                                                                  group_size=None if spec.split_groups else g)
                        if objective.needs_whole_groups and spec.split_groups:
                            with torch.no_grad():
                                current = logprobs(policy, batch)
                            kwargs["seq_weights"] = split_sequence_weights(
                                objective, current, old, adv, batch.mask, batch.group_ids, rows)
                    lp = logprobs(policy, batch)[rows] if spec.mini_batches > 1 else logprobs(policy, batch)
                    w, out = ascent_weights(objective, lp, old[rows], adv[rows], batch.mask[rows],
                                            batch.group_ids[rows], of="loss", **kwargs)
                    grad_steps += 1
                    if grad_steps % cfg.diag_every == 0:
                        diag = defined(cancellation_diagnostics(
                            w, batch.token_ids[rows], batch.mask[rows], batch.group_ids[rows], adv[rows],
                            entropies=ent[rows], group_size=g, clipped=out.clipped))
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
                    float(np.mean(vals)) if vals else float("nan"))
            interval = {}
    final = dict(snapshot(policy, cfg))
    final.update({key: float(np.mean(vals)) for key, vals in diag_sums.items()})
    final["cancel_resid"] = final.get("diag/d1_gcpr", float("nan"))  # NaN: no step had a common prefix
    hit = [i for i, s in enumerate(success_hist) if s >= spec.threshold]
    final["t75"] = float(hit[0] if hit else cfg.steps)  # run_toy's convention: `steps` if never reached
    return {"config": _config_dict(spec), "trace_steps": trace_steps, "curves": curves, "final": final,
            "seconds": time.perf_counter() - t0}


def _config_dict(spec: TabularRun) -> dict[str, Any]:
    d = asdict(spec)
    d["toy"] = asdict(spec.toy)
    return d
