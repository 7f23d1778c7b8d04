"""Held-out evaluation (`eval:` in the job spec): the evaluation rows answered by the job's own rollout
replicas with the current weights, scored by the job's own reward pool.

The same prompts and the same sampling seeds every time, so two evaluations differ only by the weights.
Metrics are `eval/...` (accuracy = the mean over samples, i.e. pass@1; `eval/pass@k` = share of prompts with
at least one correct sample among k; `eval/greedy/...` for the greedy pass of `also_greedy`); each sample's
verdict, mode and token count go to `eval/step_<N>.jsonl` in the run dir.
`run_eval_only` evaluates a model or checkpoint without training (`tgc eval`, a job with `steps: 0`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from tgc_rl.config import JobSpec
from tgc_rl.rollout.engine import Sampling
from tgc_rl.run_layout import EVAL_ACCURACY
from tgc_rl.tasks.dataset import DatasetParams, DatasetTask
from tgc_rl.trainer.data import Prompt, derive_seed, encode_item

log = logging.getLogger("tgc.trainer")

_EVAL_SEED_SALT = 0x65766131  # eval sampling seeds never coincide with training ones


def eval_task(spec: JobSpec) -> DatasetTask:
    """The evaluation rows: `eval.dataset` whole, else the training dataset's held-out rows."""
    ev = spec.eval
    if ev is None:
        raise ValueError("the job spec has no `eval` section")
    if ev.dataset is not None:
        return DatasetTask(seed=spec.seed, role="all", params=ev.dataset)
    if not isinstance(params := spec.task.params, DatasetParams):  # JobSpec's own check refuses this spec
        raise ValueError("eval.dataset: name the evaluation rows (the task is not a `dataset` task)")
    return DatasetTask(seed=spec.seed, role="holdout", params=params)


class Evaluator:
    """Builds the evaluation prompts once; `run(rollout, rewards)` evaluates the replicas' current weights."""

    def __init__(self, spec: JobSpec, encode, run_dir: Path | None = None):
        self.spec, self.run_dir = spec, run_dir
        if spec.eval is None:
            raise ValueError("an Evaluator needs the spec's `eval` section")
        ev = self.eval = spec.eval
        self.task = eval_task(spec)
        limit = spec.sampling.max_prompt_tokens
        self.task.filter_prompts(lambda item: len(encode(item)) <= limit)
        n = min(len(self.task), ev.max_prompts)
        self.prompts = [Prompt(i, item, encode(item)) for i in range(n) for item in [self.task.eval_item(i)]]
        self.k = ev.samples_per_prompt
        self.sampling = Sampling(
            0.0 if ev.greedy else ev.temperature,
            1.0 if ev.greedy else ev.top_p,
            ev.max_new_tokens or spec.sampling.max_new_tokens,
        )
        self.seeds = [derive_seed(spec.seed, p.index, _EVAL_SEED_SALT) for p in self.prompts]
        log.info(
            "evaluation: %d prompts x %d samples (%s), %d dropped as longer than %d prompt tokens",
            len(self.prompts),
            self.k,
            "greedy" if self.eval.greedy else f"T={self.eval.temperature}",
            self.task.dropped_too_long,
            limit,
        )

    def run(self, rollout, rewards, step: int, tokenizer) -> dict[str, float]:
        t0 = time.perf_counter()
        passes = [("sampled" if self.k > 1 or not self.eval.greedy else "greedy", self.k, self.sampling)]
        if self.eval.also_greedy:
            passes.append(("greedy", 1, Sampling(0.0, 1.0, self.sampling.max_new_tokens)))
        metrics: dict[str, float] = {}
        samples: list[dict[str, Any]] = []
        for mode, k, sampling in passes:
            outs = rollout.generate([p.token_ids for p in self.prompts], k, self.seeds, sampling)
            completions = [c for cs in outs for c in cs]
            texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
            items = [p.item for p in self.prompts for _ in range(k)]
            scores = rewards.score(items, texts)
            prefix = "eval/greedy/" if len(passes) > 1 and mode == "greedy" else "eval/"
            metrics.update({prefix + key[5:]: v for key, v in summarise(scores, completions, k).items()})
            samples += [
                {
                    "id": item.id,
                    "row": item.meta.get("row"),
                    "mode": mode,
                    "reward": score.reward,
                    "status": score.status,
                    "detail": score.detail,
                    "tokens": len(c.token_ids),
                    "response": text,
                }
                for item, c, text, score in zip(items, completions, texts, scores, strict=True)
            ]
        metrics["eval/dropped_too_long"] = float(self.task.dropped_too_long)
        metrics["timing/eval_s"] = time.perf_counter() - t0
        if self.run_dir is not None:
            folder = self.run_dir / "eval"
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"step_{step}.jsonl", "w") as fh:
                fh.writelines(json.dumps(s) + "\n" for s in samples)
        return metrics


def summarise(scores, completions, k: int) -> dict[str, float]:
    """eval/ metrics of samples laid out prompt by prompt, k each."""
    n = len(scores)
    correct = [s.correct for s in scores]
    prompts = n // k if k else 0
    lengths = [len(c.token_ids) for c in completions]
    # the length of right and wrong answers apart (when there are any): a 1/|o| length bias shows as their
    # gap moving
    apart = {}
    for name, verdict in (("correct", True), ("incorrect", False)):
        found = [n for n, ok in zip(lengths, correct, strict=True) if ok == verdict]
        if found:
            apart[f"eval/length_{name}_mean"] = sum(found) / len(found)
    return {
        EVAL_ACCURACY: sum(correct) / max(n, 1),
        "eval/reward_mean": sum(s.reward for s in scores) / max(n, 1),
        f"eval/pass@{k}": sum(any(correct[i * k : (i + 1) * k]) for i in range(prompts)) / max(prompts, 1),
        "eval/prompts": float(prompts),
        "eval/samples": float(n),
        "eval/timeouts": float(sum(s.status == "timeout" for s in scores)),
        "eval/errors": float(sum(s.status == "error" for s in scores)),
        "eval/response_length_mean": sum(lengths) / max(n, 1),
        "eval/truncated_frac": sum(c.finish_reason == "length" for c in completions) / max(n, 1),
        **apart,
    }


def run_eval_only(
    spec: JobSpec, run_dir: Path, model_path: Path | None = None, reporter=None
) -> dict[str, float]:
    """Evaluate a model (the spec's, or `model_path`, e.g. a checkpoint's `model` dir) without training: rollout
    replicas and a reward pool only, no learner. Writes metrics.jsonl (step 0) and eval/step_0.jsonl."""
    from tgc_rl.models import load_tokenizer, model_dir
    from tgc_rl.trainer.actors import JobActors
    from tgc_rl.trainer.metrics import MetricsSink

    tokenizer = load_tokenizer(spec.model)
    evaluator = Evaluator(spec, lambda item: encode_item(tokenizer, spec.model, item), run_dir)
    path = model_path or model_dir(spec.model, spec.seed)
    sink = MetricsSink(run_dir, spec.name, 1, progress=False)
    actors = None
    try:
        actors = JobActors.start(spec, path, learner=False)
        metrics = evaluator.run(actors.rollout, actors.rewards, 0, tokenizer)
        sink.log(0, metrics)
        if reporter is not None:
            reporter.step(0, metrics)
        return metrics
    finally:
        if actors is not None:
            actors.stop()
        sink.close()
