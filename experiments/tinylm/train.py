"""One RL run of testbed 2: the tiny LM trained with an rlcore objective, measured as it goes.

The update follows the project's learner contract: advantages from `objective.advantages` over the whole
step, `objective.stages` (Lopti), per-optimizer-step `StepNorm`, and the loss's own ascent weights
w = -dL/dlogprobs (`rlcore.diagnostics.ascent_weights`) both for training (`logprobs.backward(-w)`) and
for the diagnostics (D1 residual, D3, D7, D10, D11) of every optimizer step.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

import rlcore
from experiments.diag import defined, mean_defined
from experiments.minibatches import minibatch_rows, split_sequence_weights
from experiments.tinylm.measures import Probe
from experiments.tinylm.model import ModelConfig
from experiments.tinylm.policy import Rollout, sample, token_logprobs
from experiments.tinylm.pretrain import DEFAULT_CACHE, PretrainConfig, pretrained
from experiments.tinylm.task import PROMPT_LEN, SyntheticTask, TaskConfig
from rlcore.diagnostics import ascent_weights, cancellation_diagnostics

FORKING_QUANTILE = 0.8  # "forking" tokens: the top 20% of response positions by entropy (arXiv 2506.01939)


@dataclass(frozen=True)
class RunConfig:
    objective: str = "grpo"
    overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    steps: int = 300
    prompts_per_step: int = 16
    group_size: int = 8
    epochs: int = 4
    mini_batches: int = 1
    split_groups: bool = False
    lr: float = 1e-3
    eval_every: int = 10
    threshold: float = 0.75
    pretrain_steps: int = 1200

    def __post_init__(self) -> None:
        if self.prompts_per_step % self.mini_batches and not self.split_groups:
            raise ValueError(
                f"RunConfig: prompts_per_step ({self.prompts_per_step}) must be a multiple of "
                f"mini_batches ({self.mini_batches}) to keep groups whole"
            )
        if self.split_groups and self.group_size % self.mini_batches:
            raise ValueError(
                f"RunConfig: split_groups spreads each group over the mini-batches, so group_size "
                f"({self.group_size}) must be a multiple of mini_batches ({self.mini_batches})"
            )
        if self.split_groups and self.mini_batches < 2:
            raise ValueError(
                "RunConfig: split_groups needs mini_batches >= 2 (a group can only be split "
                "across two or more optimizer steps)"
            )


def _forking_entropy(ent: torch.Tensor, mask: torch.Tensor) -> float:
    vals = ent[mask > 0]
    if vals.numel() == 0:
        return 0.0
    cut = torch.quantile(vals, FORKING_QUANTILE)
    return float(vals[vals >= cut].mean())


def _rollout_metrics(ro: Rollout) -> dict[str, float]:
    lengths, r = ro.lengths, ro.rewards
    ok, bad = r > 0, r == 0
    return {
        "rollout/reward": float(r.mean()),
        "rollout/length": float(lengths.mean()),
        "rollout/length_correct": float(lengths[ok].mean()) if ok.any() else float("nan"),
        "rollout/length_wrong": float(lengths[bad].mean()) if bad.any() else float("nan"),
        "rollout/verbose_frac": float(ro.verbose.mean()),
        "rollout/entropy_forking": _forking_entropy(ro.entropies, ro.mask),
    }


def run(cfg: RunConfig, cache_dir=DEFAULT_CACHE, progress=None) -> dict[str, Any]:
    """Train one run; returns {config, curves: {metric: [...]}, steps: [...], final: {...}, seconds}."""
    t0 = time.perf_counter()
    task = SyntheticTask(TaskConfig())
    mcfg = ModelConfig(task.vocab_size, task.seq_len)
    model = pretrained(task, mcfg, PretrainConfig(steps=cfg.pretrain_steps, seed=cfg.seed), cache_dir)
    probe = Probe(task, copy.deepcopy(model).eval(), task.sample_probes(64, np.random.default_rng(777))[0])
    objective = rlcore.get_objective(cfg.objective, **cfg.overrides)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(1_000 + cfg.seed)  # prompts and sampling
    deal = torch.Generator().manual_seed(7_919 + cfg.seed)  # mini-batch assignment only
    torch.manual_seed(cfg.seed)
    k, b, g = task.cfg.n_prompts, cfg.prompts_per_step, cfg.group_size
    if b > k:
        raise ValueError(f"RunConfig.prompts_per_step ({b}) exceeds the task's {k} prompts")

    step_rows: list[dict[str, float]] = []
    run_d1: list[float] = []  # D1 of every optimizer step where it is defined
    eval_rows: list[dict[str, float]] = []
    eval_steps: list[int] = []

    def evaluate(step: int) -> None:
        eval_steps.append(step)
        eval_rows.append(probe.measure(model))

    evaluate(0)
    for step in range(1, cfg.steps + 1):
        prompts = torch.randperm(k, generator=gen)[:b]
        ro = sample(model, task, prompts, g, gen)
        adv = objective.advantages(ro.rewards, ro.group_ids, ro.mask)
        resp = ro.tokens[:, PROMPT_LEN:]
        diags: list[dict[str, float]] = []
        losses: list[dict[str, float]] = []
        stages = objective.stages(ro.logprobs, ro.mask)
        for stage in stages:
            lopti = len(stages) > 1
            for _ in range(cfg.epochs):
                for rows in minibatch_rows(b, g, cfg.mini_batches, cfg.split_groups, deal):
                    kwargs: dict[str, Any] = {
                        "step": rlcore.StepNorm.from_mask(
                            ro.mask[rows], group_size=None if cfg.split_groups else g
                        )
                    }
                    if lopti:
                        kwargs["stage_mask"] = stage[rows]
                    if objective.needs_whole_groups and cfg.split_groups:
                        with torch.no_grad():  # DFPO over whole groups, at the current parameters
                            current = token_logprobs(model, task, ro.tokens)[0] * ro.mask
                        kwargs["seq_weights"] = split_sequence_weights(
                            objective, current, ro.logprobs, adv, ro.mask, ro.group_ids, rows
                        )
                    lp, _ = token_logprobs(model, task, ro.tokens[rows])
                    lp = lp * ro.mask[rows]
                    w, out = ascent_weights(
                        objective,
                        lp,
                        ro.logprobs[rows],
                        adv[rows],
                        ro.mask[rows],
                        ro.group_ids[rows],
                        of="loss",
                        **kwargs,
                    )
                    opt.zero_grad(set_to_none=True)
                    lp.backward(-w)
                    opt.step()
                    diags.append(
                        defined(
                            cancellation_diagnostics(
                                w,
                                resp[rows],
                                ro.mask[rows],
                                ro.group_ids[rows],
                                adv[rows],
                                old_logprobs=ro.logprobs[rows],
                                entropies=ro.entropies[rows],
                                clipped=out.clipped,
                                group_size=g,
                            )
                        )
                    )
                    losses.append(out.metrics)
        row = _rollout_metrics(ro)
        row.update(mean_defined(diags))
        run_d1.extend(d["diag/d1_gcpr"] for d in diags if "diag/d1_gcpr" in d)
        row.update(
            {
                key: float(np.mean([m.get(key, 0.0) for m in losses]))
                for key in losses[0]
                if key.startswith("clip/")
            }
        )
        step_rows.append(row)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            evaluate(step)
        if progress is not None:
            progress(step, row)
    out = _summarise(cfg, step_rows, eval_steps, eval_rows, time.perf_counter() - t0)
    # D1 is a property of the objective, not of the end of training: average it over the whole run.
    out["final"]["diag/d1_gcpr"] = float(np.mean(run_d1)) if run_d1 else float("nan")
    out["final"]["diag/d1_steps_measured"] = float(len(run_d1))
    return out


def _summarise(
    cfg: RunConfig,
    step_rows: list[dict[str, float]],
    eval_steps: list[int],
    eval_rows: list[dict[str, float]],
    seconds: float,
) -> dict[str, Any]:
    keys = sorted({key for row in step_rows for key in row})
    per_step = {key: [row.get(key, float("nan")) for row in step_rows] for key in keys}
    tail = max(1, len(step_rows) // 10)  # rollout metrics are noisy: the final value is the last 10%
    final = {
        key: float(np.nanmean(vals[-tail:])) if np.isfinite(vals[-tail:]).any() else float("nan")
        for key, vals in per_step.items()
    }
    final.update(eval_rows[-1])
    acc = [row["eval/accuracy"] for row in eval_rows]
    hit = [s for s, a in zip(eval_steps, acc, strict=True) if a >= cfg.threshold]
    final["eval/steps_to_threshold"] = float(hit[0]) if hit else float("nan")
    final["eval/accuracy_gain"] = acc[-1] - acc[0]
    final["probe/learning_tax"] = final["probe/kl"] / max(final["eval/accuracy_gain"], 1e-3)
    # Curves every eval interval: eval metrics as measured, rollout metrics averaged over the interval.
    curves = {key: [row[key] for row in eval_rows] for key in eval_rows[0]}
    bounds = list(zip([0, *eval_steps[1:-1]], eval_steps[1:], strict=True))
    for key in per_step:
        vals = np.asarray(per_step[key])
        curves[key] = [
            float(np.nanmean(vals[a:b])) if np.isfinite(vals[a:b]).any() else float("nan") for a, b in bounds
        ]
    return {
        "config": asdict(cfg),
        "eval_steps": eval_steps,
        "curves": curves,
        "final": final,
        "seconds": seconds,
    }
