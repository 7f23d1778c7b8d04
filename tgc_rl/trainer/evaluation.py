"""Held-out evaluation (`eval:` in the job spec): the evaluation rows answered by the job's own rollout
replicas with the current weights, scored by the job's own reward pool.

The same prompts and the same sampling seeds every time, so two evaluations differ only by the weights.
Metrics are `eval/...` (accuracy = the mean over samples, i.e. pass@1; `eval/pass@k` = share of prompts with
at least one correct sample among k; `eval/greedy/...` for the greedy pass of `also_greedy`); each sample's
verdict, mode and token count go to `eval/step_<N>.jsonl` in the run dir.
A multi-turn job (`env:`) evaluates whole trajectories in its environment, run by the training sampler
(tgc_rl/trainer/multi_turn.py): pass@k over trajectories, scored by each one's reward; its records keep the
transcript, turns, tool calls and end reason.
`run_eval_only` evaluates a model or checkpoint without training (`tgc eval`, a job with `steps: 0`): a full
fine-tuning checkpoint's or a LoRA job's merged weights as they are, an adapter-only LoRA checkpoint as its
adapter on the base it was trained on (`CheckpointModel`, docs/lora.md).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgc_rl.config import JobSpec, ModelSpec
from tgc_rl.rollout.engine import Sampling
from tgc_rl.run_layout import EVAL_ACCURACY, TRAINER_STATE_FILE
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.tasks.dataset import DatasetParams, DatasetTask
from tgc_rl.trainer.data import Prompt, derive_seed, encode_item

if TYPE_CHECKING:
    from tgc_rl.envs import Trajectory

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
            answer = self._single_turn if self.spec.env is None else self._trajectories
            pass_metrics, records = answer(rollout, rewards, tokenizer, mode, k, sampling)
            prefix = "eval/greedy/" if len(passes) > 1 and mode == "greedy" else "eval/"
            metrics.update({prefix + key[5:]: v for key, v in pass_metrics.items()})
            samples += records
        metrics["eval/dropped_too_long"] = float(self.task.dropped_too_long)
        metrics["timing/eval_s"] = time.perf_counter() - t0
        if self.run_dir is not None:
            folder = self.run_dir / "eval"
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"step_{step}.jsonl", "w") as fh:
                fh.writelines(json.dumps(s) + "\n" for s in samples)
        return metrics

    def _single_turn(
        self, rollout, rewards, tokenizer, mode: str, k: int, sampling: Sampling
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        outs = rollout.generate([p.token_ids for p in self.prompts], k, self.seeds, sampling)
        completions = [c for cs in outs for c in cs]
        texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        items = [p.item for p in self.prompts for _ in range(k)]
        scores = rewards.score(items, texts)
        records = [
            _record(item, mode, score, len(c.token_ids), text)
            for item, c, text, score in zip(items, completions, texts, scores, strict=True)
        ]
        return summarise(scores, completions, k), records

    def _trajectories(
        self, rollout, rewards, tokenizer, mode: str, k: int, sampling: Sampling
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Multi-turn: each prompt's k samples are whole trajectories in the job's environment (its bounds,
        its workers beside the reward workers), run by the training sampler; a trajectory's reward is its
        score, and one that failed (bridge, deadline, env_error) counts as an error."""
        from tgc_rl.trainer.multi_turn import BOUND_REASONS, FAILED, MultiTurnSampler

        if self.spec.env is None:
            raise RuntimeError("Evaluator._trajectories: the job spec has no `env` section")
        sampler = MultiTurnSampler(self.spec.env, self.spec.seed, tokenizer, rollout, rewards)
        # no more environment workers than a training step starts (its slots are reused)
        per_chunk = max(1, self.spec.prompts_per_step * self.spec.group_size // k)
        trajectories: list[Trajectory] = []
        for a in range(0, len(self.prompts), per_chunk):
            chunk = self.prompts[a : a + per_chunk]
            seeds = self.seeds[a : a + per_chunk]
            trajectories += sampler.run_trajectories([p.item for p in chunk], seeds, k, sampling).trajectories
        items = [p.item for p in self.prompts for _ in range(k)]
        scores = [
            Score(t.reward, "error" if t.end_reason in FAILED else "ok", t.detail) for t in trajectories
        ]
        records = [
            {
                **_record(
                    item,
                    mode,
                    score,
                    t.model_tokens,
                    next((m.content for m in reversed(t.messages) if m.role == "assistant"), ""),
                ),
                "end_reason": t.end_reason,
                "turns": t.turns,
                "tool_calls": t.tool_calls,
                "tool_errors": t.tool_errors,
                "tool_timeouts": t.tool_timeouts,
                "transcript": [m.as_dict() for m in t.messages],
            }
            for item, t, score in zip(items, trajectories, scores, strict=True)
        ]
        lengths = [t.model_tokens for t in trajectories]
        cut = [t.end_reason == "max_total_tokens" for t in trajectories]
        n = max(len(trajectories), 1)
        return {
            **_summary(scores, lengths, cut, k),
            "eval/turns_per_trajectory": sum(t.turns for t in trajectories) / n,
            "eval/tool_calls_per_trajectory": sum(t.tool_calls for t in trajectories) / n,
            "eval/tool_call_frac": sum(t.tool_calls > 0 for t in trajectories) / n,
            "eval/tool_errors": float(sum(t.tool_errors for t in trajectories)),
            "eval/tool_timeouts": float(sum(t.tool_timeouts for t in trajectories)),
            "eval/bound_hits": float(sum(t.end_reason in BOUND_REASONS for t in trajectories)),
        }, records


def _record(item: TaskItem, mode: str, score: Score, tokens: int, response: str) -> dict[str, Any]:
    """One sample's line in eval/step_<N>.jsonl."""
    return {
        "id": item.id,
        "row": item.meta.get("row"),
        "mode": mode,
        "reward": score.reward,
        "status": score.status,
        "detail": score.detail,
        "tokens": tokens,
        "response": response,
    }


def summarise(scores, completions, k: int) -> dict[str, float]:
    """eval/ metrics of samples laid out prompt by prompt, k each."""
    lengths = [len(c.token_ids) for c in completions]
    return _summary(scores, lengths, [c.finish_reason == "length" for c in completions], k)


def _summary(scores: list[Score], lengths: list[int], truncated: list[bool], k: int) -> dict[str, float]:
    """eval/ metrics of answers laid out prompt by prompt, k each: pass@k over the k answers of a prompt
    (single-turn responses or whole trajectories), `lengths` in model tokens, `truncated` cut at a length
    bound."""
    n = len(scores)
    correct = [s.correct for s in scores]
    prompts = n // k if k else 0
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
        "eval/truncated_frac": sum(truncated) / max(n, 1),
        **apart,
    }


@dataclass(frozen=True)
class CheckpointModel:
    """The policy a checkpoint holds, as an evaluation loads it: full weights in `model/` (a full fine-tuning
    job's, or a LoRA job's merged weights with `model.lora.save_merged`), else the LoRA adapter in `adapter/` on
    the base model of the job's stored spec."""

    checkpoint: Path
    adapter: Path | None  # None: `model/` holds the whole policy
    base: ModelSpec | None  # an adapter's job's model section (base, tokenizer, rank); None for full weights
    seed: int  # the job's seed (a `random` base is built from it)
    version: int  # the policy version the checkpoint was saved at

    @property
    def kind(self) -> str:
        if self.adapter is not None:
            return "adapter"
        return "merged" if (self.checkpoint / "adapter").is_dir() else "full"

    @classmethod
    def read(cls, checkpoint: Path) -> CheckpointModel:
        """Raises ValueError saying what is missing when `checkpoint` holds no loadable policy."""
        checkpoint = Path(checkpoint)
        state_file = checkpoint / TRAINER_STATE_FILE
        if not state_file.is_file():
            raise ValueError(
                f"{checkpoint} is not a checkpoint (no {TRAINER_STATE_FILE}); pass a complete checkpoint "
                "directory, e.g. runs/<job>/checkpoints/step_<N>"
            )
        state = json.loads(state_file.read_text())
        version = int(state.get("version", 0))
        stored = state.get("spec")
        seed = int(stored.get("seed", 0)) if isinstance(stored, dict) else 0
        if (checkpoint / "model" / "config.json").is_file():  # merged weights win: no adapter support needed
            return cls(checkpoint, None, None, seed, version)
        adapter = checkpoint / "adapter"
        if not (adapter / "adapter_config.json").is_file():
            raise ValueError(
                f"{checkpoint} holds neither model weights (model/config.json) nor a LoRA adapter "
                "(adapter/adapter_config.json); pass a checkpoint written by a training job"
            )
        if not isinstance(stored, dict) or not isinstance(stored.get("model"), dict):
            raise ValueError(
                f"{checkpoint}: an adapter-only checkpoint without its job's spec in {TRAINER_STATE_FILE}: the "
                "base model it adapts is unknown; evaluate a checkpoint saved with model.lora.save_merged: true"
            )
        base = ModelSpec.model_validate(stored["model"])
        if base.lora is None:
            raise ValueError(f"{checkpoint}: holds an adapter but its job's spec has no model.lora")
        return cls(checkpoint, adapter, base, seed, version)

    def eval_spec(self, spec: JobSpec) -> JobSpec:
        """`spec` with the adapter's job's model section: its base and tokenizer, and the LoRA settings that
        make the engine serve an adapter of its rank (a spec naming another base would misapply it)."""
        if self.base is None or spec.model == self.base:
            return spec
        log.info("evaluating %s's adapter on its job's model (%s)", self.checkpoint, self.base.source)
        return JobSpec.parse(
            {**spec.to_dict(), "model": self.base.model_dump(mode="json")}, "evaluation spec"
        )


def _load_adapter(rollout, spec: JobSpec, ck: CheckpointModel, base: Path) -> None:
    """Put the checkpoint's adapter into the replicas the way a training sync does: vLLM serves it as a LoRA
    adapter; the transformers engine, which has no adapters, gets the base with it merged by peft."""
    from tgc_rl.rollout import RolloutSpec, engine_kind
    from tgc_rl.weight_sync.adapter import merged_model_state, read_peft_dir

    if ck.adapter is None:
        raise ValueError(f"{ck.checkpoint} holds no adapter to load")
    if engine_kind(RolloutSpec.of(spec)) == "vllm":
        rollout.update_weights(read_peft_dir(ck.adapter), ck.version)
        how = "served by vLLM as a LoRA adapter"
    else:
        rollout.update_weights(merged_model_state(base, ck.adapter), ck.version)
        how = "merged into the base by peft (the transformers engine has no adapters)"
    log.info("evaluation: the adapter of %s on %s, %s", ck.checkpoint, base, how)


def run_eval_only(
    spec: JobSpec, run_dir: Path, checkpoint: Path | None = None, reporter=None
) -> dict[str, float]:
    """Evaluate a model (the spec's, or the policy `checkpoint` holds: `CheckpointModel`) without training:
    rollout replicas and a reward pool only, no learner. Writes metrics.jsonl (step 0) and eval/step_0.jsonl."""
    from tgc_rl.models import load_tokenizer, model_dir
    from tgc_rl.trainer.actors import JobActors
    from tgc_rl.trainer.metrics import MetricsSink

    ck = None
    if checkpoint is not None and (checkpoint / TRAINER_STATE_FILE).is_file():
        ck = CheckpointModel.read(checkpoint)
        spec = ck.eval_spec(spec)
    if ck is not None and ck.base is not None:
        path = model_dir(ck.base, ck.seed)
    elif checkpoint is not None:  # full or merged weights (a folder without trainer state: its model/ as is)
        path = checkpoint / "model"
    else:
        path = model_dir(spec.model, spec.seed)
    tokenizer = load_tokenizer(spec.model)
    evaluator = Evaluator(spec, lambda item: encode_item(tokenizer, spec.model, item), run_dir)
    sink = MetricsSink(run_dir, spec.name, 1, progress=False)
    actors = None
    try:
        actors = JobActors.start(spec, path, learner=False)
        if ck is not None and ck.adapter is not None:
            _load_adapter(actors.rollout, spec, ck, path)
        metrics = evaluator.run(actors.rollout, actors.rewards, 0, tokenizer)
        sink.log(0, metrics)
        if reporter is not None:
            reporter.step(0, metrics)
        return metrics
    finally:
        if actors is not None:
            actors.stop()
        sink.close()
