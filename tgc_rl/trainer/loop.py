"""One RL job, step by step: prompts -> rollout actors -> reward pool -> advantages (rlcore) -> learner
group (FSDP2) -> weights published once to the object store (or broadcast) -> rollout actors load them."""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import rlcore
from tgc_rl.batch import TrainBatch, collate
from tgc_rl.config import JobSpec
from tgc_rl.run_layout import (
    CANCEL_FILE,
    CHECKPOINTS_DIR,
    CURVES_FILE,
    D2_RESIDUAL,
    D4_GROUPS_COMPLETE,
    PRESERVES_CANCELLATION,
    RESPONSE_LENGTH_MEAN,
    RESPONSE_TOKENS,
    REWARD_ACCURACY,
    REWARD_ERRORS,
    REWARD_MEAN,
    REWARD_TIMEOUTS,
    ROLLOUT_INFORMATIVE_GROUPS,
    ROLLOUT_STALE_DROPPED,
    ROLLOUT_STEPS_PER_CALL,
    SPEC_FILE,
    THROUGHPUT_TOKENS_PER_S,
    TIMING_GENERATE,
    TIMING_PREPARE,
    TIMING_REWARD,
    TIMING_STEP,
    TIMING_SYNC,
    TIMING_TRAIN,
    JobState,
    checkpoint_name,
)
from tgc_rl.tasks.dataset import DatasetParams
from tgc_rl.trainer.actors import JobActors
from tgc_rl.trainer.actors import stop as stop_actors
from tgc_rl.trainer.checkpoints import Checkpoints, read_state
from tgc_rl.trainer.credit import credit_for
from tgc_rl.trainer.data import Prompt, PromptSource, derive_seed
from tgc_rl.trainer.groups import Group, Rollout
from tgc_rl.trainer.metrics import MetricsSink
from tgc_rl.trainer.multi_turn import MultiTurnSampler, with_means
from tgc_rl.trainer.reporting import Reporter
from tgc_rl.trainer.traces import TraceWriter
from tgc_rl.trainer.trackers import RunEnd, RunInfo, Trackers, flatten
from tgc_rl.weight_sync import WeightSync

log = logging.getLogger("tgc.trainer")

MAX_REFILL_ROUNDS = 4  # dynamic sampling: refill attempts before training on a smaller batch


class Trainer:
    """Owns the actors of one job and drives them; `run()` returns the final state."""

    def __init__(
        self,
        spec: JobSpec,
        run_dir: Path,
        reporter: Reporter,
        resume: Path | None = None,
        progress: bool | None = None,
    ):
        from tgc_rl.models import load_tokenizer, model_dir

        self.spec, self.run_dir, self.reporter = spec, run_dir, reporter
        self.objective = rlcore.Objective(spec.objective.name, spec.objective_config())
        self.tokenizer = load_tokenizer(spec.model)
        self.checkpoints = Checkpoints(run_dir / CHECKPOINTS_DIR, spec.checkpoint.keep_last)
        self.outcome = JobState.FAILED  # what run() ended with; the trackers' runs end with it
        params = flatten(spec.model_dump(mode="json", by_alias=True))
        self.trackers = Trackers.from_spec(
            spec.trackers, RunInfo(spec.name, os.environ.get("TGC_JOB_ID", ""), run_dir, params)
        )
        self.metrics = MetricsSink(run_dir, spec.name, spec.steps, progress, self.trackers)
        self.traces = TraceWriter(run_dir, spec.traces, spec.seed)
        self.stop_reason: str | None = None
        self.step = 0
        self.version = 0
        position = 0
        model_path = model_dir(spec.model, spec.seed)
        state: dict[str, Any] = {}
        self.resumed = resume is not None
        if resume is not None:
            state = read_state(resume)
            self.step, self.version, position = state["step"], state["version"], state["data_position"]
            if spec.model.lora is None:  # a LoRA job keeps its base; its adapter is in the learner state
                model_path = resume / "model"
            self.metrics.truncate_after(self.step)
            self.traces.resume(resume.parent.parent, self.step)  # <run dir>/checkpoints/step_N
        self.data = PromptSource(spec, self.tokenizer, position)
        self.trained_position = position
        self.evaluator = None
        self.credit = credit_for(spec, self.tokenizer, self.objective)
        # the job's claim (an IBPO credit mask can break what the objective alone preserves), held against
        # each step's D2 here and, through the step metrics, by the TgcCancellationBroken alert
        preserves = self.credit.preserves
        self.residuals = ResidualWatch(preserves, spec.objective.name, reporter)
        if spec.eval is not None:
            from tgc_rl.trainer.evaluation import Evaluator

            self.evaluator = Evaluator(spec, self.data.encode_item, run_dir)
        self._start_actors(model_path, resume)
        self.sampler = None  # multi-turn: each prompt's group is G trajectories in the job's environment
        if spec.env is not None:
            self.sampler = MultiTurnSampler(spec.env, spec.seed, self.tokenizer, self.rollout, self.rewards)

    # -- actors --------------------------------------------------------------------------------------
    def _start_actors(self, model_path: Path, resume: Path | None) -> None:
        actors = JobActors.start(self.spec, model_path, resume=resume)
        if actors.learner is None:  # JobActors.start starts one unless told not to
            raise RuntimeError("the job's actors started without a learner group")
        self.rewards, self.learner, self.rollout = actors.rewards, actors.learner, actors.rollout
        self.weight_sync = WeightSync(self.spec, self.learner, self.rollout)
        if resume is not None:  # the replicas hold the checkpoint's weights; stamp them with its version
            self.weight_sync(self.version)

    def shutdown(self) -> None:
        # the parts that started (a failed start stopped its own): JobActors' order and rules
        stop_actors(*(getattr(self, part, None) for part in ("rollout", "learner", "rewards")))
        self.metrics.close()
        self.traces.close()
        latest = self.checkpoints.latest()
        artifacts = [self.run_dir / CURVES_FILE, self.run_dir / SPEC_FILE]  # curves: written before shutdown
        self.trackers.close(RunEnd(self.outcome, str(latest) if latest else None, artifacts))

    # -- rollout ------------------------------------------------------------------------------------
    def _seeds(self, prompts: list[Prompt], attempt: int) -> list[int]:
        return [derive_seed(self.spec.seed, p.index, attempt) for p in prompts]

    def _generate_groups(
        self, prompts: list[Prompt], attempt: int = 0
    ) -> tuple[list[Group], dict[str, float]]:
        if self.sampler is not None:
            mt, counts = self.sampler.generate_groups(prompts, self.spec.group_size, attempt)
            return [Group(g.prompt, g.completions, g.scores, keep=g.keep) for g in mt], counts
        t0 = time.perf_counter()
        outs = self.rollout.generate(
            [p.token_ids for p in prompts], self.spec.group_size, self._seeds(prompts, attempt)
        )
        t1 = time.perf_counter()
        items = [p.item for p in prompts for _ in range(self.spec.group_size)]
        texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for cs in outs for c in cs]
        scores = self.rewards.score(items, texts)
        t2 = time.perf_counter()
        G = self.spec.group_size
        groups = [
            Group(p, cs, scores[i * G : (i + 1) * G])
            for i, (p, cs) in enumerate(zip(prompts, outs, strict=True))
        ]
        return groups, {TIMING_GENERATE: t1 - t0, TIMING_REWARD: t2 - t1}

    def _rollout(self) -> Rollout:
        return self._rollouts(1)[0]

    def _rollouts(self, steps: int) -> list[Rollout]:
        """`steps` steps' groups sampled in one engine call, so they share the slowest response's tail; with
        dynamic sampling, all-equal-reward groups are replaced (DAPO). Dealt in data order, each step's rollout
        ends where a resumed job must start after training it. Fewer than `steps` when too few groups survive
        (multi-turn drops failed trajectories)."""
        want = self.spec.prompts_per_step * steps
        groups, timing = self._generate_groups(self.data.take(want))
        # multi-turn: every group dropped (failed trajectories); sample other prompts
        for attempt in range(1, MAX_REFILL_ROUNDS + 1):
            if groups or not self.data.available(want):
                break
            groups, t = self._generate_groups(self.data.take(want), attempt)
            timing = {k: timing[k] + t[k] for k in timing}
        if not groups:
            raise RuntimeError(f"no group left to train at step {self.step + 1}: see the multi_turn/ metrics")
        dropped = 0
        if self.spec.dynamic_sampling:
            for attempt in range(1, MAX_REFILL_ROUNDS + 1):
                kept = [g for g in groups if g.informative]
                dropped += len(groups) - len(kept)
                groups = kept
                if len(groups) >= want or not self.data.available(want - len(groups)):
                    break
                more, t = self._generate_groups(self.data.take(want - len(groups)), attempt)
                groups += more
                timing = {k: timing[k] + t[k] for k in timing}
            groups = [g for g in groups if g.informative][:want] or groups[:want]
        parts = [part for part in _deal(groups, steps) if part]
        shared = {k: v / len(parts) for k, v in timing.items()}  # one call's time, each step its share
        shared |= {
            "rollout/groups_dropped": dropped / len(parts),
            ROLLOUT_STEPS_PER_CALL: float(len(parts)),
        }
        if self.sampler is not None:
            shared.update(with_means(shared))  # per trajectory: the same for the call and each share of it
        out = []
        for i, part in enumerate(parts):
            metrics = dict(shared)
            # the weights that sampled them
            self.credit.after_rollout(part, self.rollout, self.rewards, metrics)
            last = i == len(parts) - 1  # the last also covers the prompts whose groups were dropped after it
            end = self.data.position if last else max(g.prompt.index for g in part) + 1
            out.append(Rollout(part, end, metrics))
        return out

    # -- one step -----------------------------------------------------------------------------------
    def build_batch(self, groups: list[Group]) -> tuple[TrainBatch, dict[str, float]]:
        """The step's TrainBatch (advantages by the job's credit scheme) and metrics of making it."""
        prompts, comps, gids, rewards = [], [], [], []
        for g_id, g in enumerate(groups):
            for c, s in zip(g.completions, g.scores, strict=True):
                prompts.append(g.prompt.token_ids)
                comps.append(c)
                gids.append(g_id)
                rewards.append(s.reward)
        reward_t = torch.tensor(rewards, dtype=torch.float32)
        sampled = collate(prompts, comps, gids, reward_t, self.tokenizer.pad_token_id)
        return self.credit.train_batch(groups, sampled)

    def train_step(self, rollout: Rollout) -> dict[str, float]:
        t0 = time.perf_counter()
        batch, batch_metrics = self.build_batch(rollout.groups)
        staleness = (self.version - batch.versions).float()
        t1 = time.perf_counter()
        learner_metrics = self.learner.train_step(batch)
        t2 = time.perf_counter()
        self.version += 1
        self.trained_position = rollout.end_position
        self._trace(rollout, batch)
        sync = self.weight_sync(self.version)
        t3 = time.perf_counter()
        m = {
            **rollout.metrics,
            **batch_metrics,
            **learner_metrics,
            **_rollout_metrics(rollout, batch),
            **self._data_metrics(),
            **_prefixed("rollout/", self.rollout.stats()),
            **_prefixed("reward/", self.rewards.stats()),
            **self.trackers.stats(),
        }
        m.update(
            {
                TIMING_TRAIN: t2 - t1,
                TIMING_SYNC: t3 - t2,
                TIMING_PREPARE: t1 - t0,
                PRESERVES_CANCELLATION: float(self.residuals.preserves),
                "policy/version": float(self.version),
                "policy/staleness_mean": staleness.mean().item(),
                "policy/staleness_max": staleness.max().item(),
                "sync/bytes": float(sync.get("bytes", 0.0)),
                "sync/broadcast": sync["broadcast"],
                **(
                    {"sync/canary_logprob_diff": sync["canary_logprob_diff"]}
                    if "canary_logprob_diff" in sync
                    else {}
                ),
            }
        )
        return m

    def _trace(self, rollout: Rollout, batch: TrainBatch) -> None:
        """The step's sample of trajectories (spec.traces), with the advantages it was trained with."""
        if not self.spec.traces.enabled:
            return
        adv = batch.advantages
        if adv.ndim == 2:  # per token: its mean over the response
            adv = (adv * batch.response_mask).sum(1) / batch.response_mask.sum(1).clamp_min(1)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        try:
            records = self.traces.add_step(self.step + 1, rollout.groups, adv.tolist(), decode)
            self.trackers.log_samples(self.step + 1, records)
        except Exception as e:  # a sample that cannot be recorded must not end the training it describes
            log.warning("traces: step %d not sampled: %s", self.step + 1, e)

    # -- the job ------------------------------------------------------------------------------------
    def run(self) -> JobState:
        spec = self.spec
        depth = spec.async_.depth  # rollouts generated ahead while the learner trains (0: sync)
        per_call = spec.async_.steps_per_call
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout") if depth else None
        # calls in submission order; one worker runs them one after another, so each takes the data after the last
        ahead: deque[Future[list[Rollout]]] = deque()
        # sampled by a call whose first rollout was trained, waiting their turn
        ready: deque[Rollout] = deque()
        self.reporter.state(JobState.RUNNING, "resumed" if self.resumed else "started", self.step)
        finished = "completed all steps"
        try:
            # a checkpoint is only written after the baseline, so a run resumed at step 0 has it already
            if self.evaluator is not None and self.evaluator.eval.at_start and not self.resumed:
                baseline = self.evaluate()
                self.metrics.log(0, baseline)
                self.reporter.step(0, baseline)
            if not self.data.available(spec.prompts_per_step):
                finished = self._data_done()
            while finished == "completed all steps" and self.step < spec.steps and not self._should_stop():
                t0 = time.perf_counter()
                if not ready:
                    ready.extend(ahead.popleft().result() if ahead else [self._rollout()])
                if not ready:  # dynamic sampling's refills used up the data a queued rollout needed
                    finished = self._data_done()
                    break
                rollout = ready.popleft()
                stale = 0
                if _lag(self.version, rollout) > spec.async_.max_staleness:  # too old: drop, sample afresh
                    stale = 1
                    _drain(ahead)  # the fresh rollout is sampled on this thread: nothing may be in flight
                    ready.clear()
                    rollout = self._rollout()
                # from this rollout's end, not the live position (queued rollouts move it); `epochs` may end the job
                more = self.step + 1 < spec.steps and self.data.task.available(
                    rollout.end_position + spec.prompts_per_step - 1
                )
                # a rollout submitted now (version v) is trained at version v + (rollouts ahead) <= v + k at the
                # latest; a call of n steps is submitted once n more fit under the bound
                queued, left = len(ready) + per_call * len(ahead), spec.steps - self.step - 1
                while pool and more and (n := min(per_call, left - queued)) > 0 and queued + n <= depth:
                    ahead.append(pool.submit(self._rollouts_ahead, n))
                    queued += n
                metrics = self.train_step(rollout)
                metrics[ROLLOUT_STALE_DROPPED] = float(stale)
                self.step += 1
                metrics[TIMING_STEP] = time.perf_counter() - t0
                metrics[THROUGHPUT_TOKENS_PER_S] = metrics[RESPONSE_TOKENS] / metrics[TIMING_STEP]
                every = spec.eval.every_steps if spec.eval is not None else 0
                if self.evaluator is not None and (not more or (every and self.step % every == 0)):
                    metrics.update(self.evaluate())
                if not more and self.step < spec.steps:
                    finished = self._data_done()
                self.metrics.log(self.step, metrics)
                self.reporter.step(self.step, metrics)
                self.residuals.check(self.step, metrics)
                every = spec.checkpoint.every_steps
                if every and self.step % every == 0 and self.step < spec.steps:
                    self.save()
            for f in ahead:  # rollouts never trained on: the checkpoint's data position is before them
                f.cancel()
            self.save()
            if self.stop_reason:
                self.reporter.state(JobState.CANCELLED, self.stop_reason, self.step)
                self.outcome = JobState.CANCELLED
                return JobState.CANCELLED
            self.reporter.state(JobState.SUCCEEDED, finished, self.step)
            self.outcome = JobState.SUCCEEDED
            return JobState.SUCCEEDED
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _rollouts_ahead(self, steps: int) -> list[Rollout]:
        """Queued rollouts (on the worker, after those before it): up to `steps` in one call, as many as the data
        holds; none when it has run out."""
        while steps and not self.data.available(self.spec.prompts_per_step * steps):
            steps -= 1
        return self._rollouts(steps) if steps else []

    def evaluate(self) -> dict[str, float]:
        """Held-out evaluation of the replicas' current weights (`eval` in the spec)."""
        if self.evaluator is None:
            raise RuntimeError("evaluate() needs the spec's `eval` section; this job has none")
        return self.evaluator.run(self.rollout, self.rewards, self.step, self.tokenizer)

    def _data_done(self) -> str:
        params = self.spec.task.params
        epochs = params.epochs if isinstance(params, DatasetParams) else None
        reason = f"trained on all {epochs} epoch(s) of the dataset at step {self.step}"
        self.reporter.log(reason)
        return reason

    def _data_metrics(self) -> dict[str, float]:
        out = {"data/dropped_too_long": float(self.data.dropped_too_long)}
        if (size := self.data.task.epoch_size()) is not None:  # a finite data set (the dataset task's rows)
            out["data/epoch"] = self.trained_position / size
        return out

    def _should_stop(self) -> bool:
        if self.reporter.cancel_requested and not self.stop_reason:
            self.stop_reason = self.reporter.cancel_requested
        if (self.run_dir / CANCEL_FILE).exists() and not self.stop_reason:
            self.stop_reason = (self.run_dir / CANCEL_FILE).read_text().strip() or "cancel file found"
        return self.stop_reason is not None

    def save(self) -> Path:
        if (latest := self.checkpoints.latest()) is not None and latest.name == checkpoint_name(self.step):
            return latest
        tmp = self.checkpoints.staging(self.step)
        self.learner.save(tmp)
        self.tokenizer.save_pretrained(tmp / "model")
        path = self.checkpoints.commit(
            tmp,
            self.step,
            {
                "step": self.step,
                "version": self.version,
                "data_position": self.trained_position,
                "spec": self.spec.to_dict(),
            },
        )
        self.reporter.checkpoint(self.step, path)
        return path


@dataclass
class ResidualWatch:
    """Says so in the log (console and `tgc logs`) when a job that claims cancellation leaves a D2 residual
    above rounding: on the first such step and every `every`-th after it (each step's D2 is in its metrics)."""

    preserves: bool
    objective: str
    reporter: Reporter
    every: int = 50
    count: int = 0  # steps whose D2 broke the claim

    def check(self, step: int, metrics: dict[str, float]) -> str | None:
        d2 = metrics.get(D2_RESIDUAL, 0.0)
        if not self.preserves or d2 <= rlcore.RESIDUAL_TOLERANCE:
            return None
        self.count += 1
        if (self.count - 1) % self.every:
            return None
        complete = metrics.get(D4_GROUPS_COMPLETE, 1.0)
        split = f" (complete groups: {complete:.0%})" if complete < 1 else ""
        message = (
            f"step {step}: D2 residual {d2:.3g} > {rlcore.RESIDUAL_TOLERANCE:g} although objective "
            f"{self.objective!r} preserves cancellation ({self.count} such step(s) so far): groups split across "
            f"optimizer steps{split}, or a defect (the objective's weights disagree with its verdict: please "
            "report it with the run directory); see docs/diagnostics.md (D2, D4)."
        )
        log.warning(message)
        self.reporter.log(message)
        return message


def _lag(version: int, rollout: Rollout) -> int:
    """Versions between the learner's and the oldest weights that sampled the rollout."""
    return version - min(c.version for g in rollout.groups for c in g.completions)


def _deal(groups: list[Group], steps: int) -> list[list[Group]]:
    """`groups` in order, dealt into `steps` consecutive parts whose sizes differ by at most one."""
    size, extra = divmod(len(groups), steps)
    bounds = [i * size + min(i, extra) for i in range(steps + 1)]
    return [groups[a:b] for a, b in itertools.pairwise(bounds)]


def _drain(ahead: deque[Future[list[Rollout]]]) -> None:
    """Discard the queued rollouts: cancel those not started, wait for the one generating."""
    for f in ahead:
        f.cancel()
    for f in ahead:
        if not f.cancelled():
            f.result()
    ahead.clear()


def _prefixed(prefix: str, stats: dict[str, float]) -> dict[str, float]:
    return {(k if k.startswith(prefix) else prefix + k): float(v) for k, v in stats.items()}


def _rollout_metrics(rollout: Rollout, batch: TrainBatch) -> dict[str, float]:
    scores = [s for g in rollout.groups for s in g.scores]
    comps = [c for g in rollout.groups for c in g.completions]
    lengths = batch.response_mask.sum(1)
    rewards = batch.rewards
    n = max(len(scores), 1)
    return {
        REWARD_MEAN: rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        REWARD_ACCURACY: sum(s.correct for s in scores) / n,
        REWARD_TIMEOUTS: float(sum(s.status == "timeout" for s in scores)),
        REWARD_ERRORS: float(sum(s.status == "error" for s in scores)),
        ROLLOUT_INFORMATIVE_GROUPS: sum(g.informative for g in rollout.groups) / max(len(rollout.groups), 1),
        RESPONSE_LENGTH_MEAN: lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/truncated_frac": sum(c.finish_reason == "length" for c in comps) / n,
        RESPONSE_TOKENS: lengths.sum().item(),
    }
