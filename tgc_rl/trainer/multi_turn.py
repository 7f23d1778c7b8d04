"""The multi-turn sampler: a job with `env:` samples each prompt's group as G TrajectoryRuns (docs/multi_turn.md).

Per round, every live trajectory's next prompt goes to the rollout replicas in one generate() call (n = 1,
a seed per trajectory and turn), what each sampled is cut to its trajectory's room and fed back token for
token, and the environments step in one call to their worker processes beside the reward workers
(tgc_rl/reward/env_host.py), so one slow trajectory holds no other's generation. The environment in the
driver is a proxy (`HostedEnv`) answering with what its worker replied.

Credit (issue 30): a failed trajectory (bridge, deadline, env_error) stays in its group with keep = False,
filtered before centring (`advantages(keep=)`); a group left with fewer than 2 kept is dropped; a
trajectory without a model token cannot be in a batch, so its group is dropped too (groups keep G rows).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tgc_rl.batch import Completion
from tgc_rl.envs import (
    BoundHit,
    EnvBounds,
    EnvContext,
    EnvSpec,
    Message,
    Sample,
    StepResult,
    Trajectory,
    TrajectoryRun,
)
from tgc_rl.envs.tokens import ChatTemplate, TrajectoryBuilder
from tgc_rl.reward.env_host import EnvCall, EnvReply
from tgc_rl.rollout import sample_seed
from tgc_rl.run_layout import (
    MT_BOUND_HITS,
    MT_BOUND_REASONS,
    MT_BRIDGE_FAILURES,
    MT_DROPPED_GROUPS,
    MT_DROPPED_TRAJECTORIES,
    MT_MODEL_TOKENS,
    MT_OBSERVATION_TOKENS,
    MT_STEP_COUNTERS,
    MT_TOOL_CALLS,
    MT_TOOL_ERRORS,
    MT_TOOL_TIMEOUTS,
    MT_TRAJECTORIES,
    MT_TURNS,
    MT_TURNS_PER_TRAJECTORY,
    TIMING_ENV,
    TIMING_GENERATE,
    TIMING_REWARD,
)
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.trainer.data import Prompt, derive_seed

if TYPE_CHECKING:
    from tgc_rl.reward import RewardPoolGroup
    from tgc_rl.rollout import RolloutPool
    from tgc_rl.rollout.engine import Sampling

# ended without a usable outcome: filtered before centring (keep = False), never trained towards
FAILED = frozenset({"bridge", "deadline", "env_error"})
BOUND_REASONS = MT_BOUND_REASONS
_TURN_SEEDS = 64  # EnvBounds.max_turns' upper bound: a trajectory's turns draw distinct seeds


@dataclass
class TrajectoryGroup:
    """One prompt's G trajectories as the batch takes them: `prompt` holds the trajectories' first prompt,
    `keep[i]` whether trajectory i enters the centring."""

    prompt: Prompt
    completions: list[Completion]
    scores: list[Score]
    keep: list[bool]
    trajectories: list[Trajectory]


@dataclass(frozen=True)
class TrajectoryBatch:
    """What `run_trajectories` ran: the trajectories in order, per trajectory the oldest policy version that
    sampled a turn of it, and the seconds spent generating and in the environments."""

    trajectories: list[Trajectory]
    versions: list[int]
    generate_s: float
    env_s: float


class HostedEnv:
    """The driver's stand-in for an environment in a worker process: `reset`/`step` return the reply the
    sampler fetched for this trajectory (`answer`), so the TrajectoryRun's rules apply unchanged."""

    def __init__(self, ctx: EnvContext):
        self.ctx = ctx
        self._reply: EnvReply | None = None

    def answer(self, reply: EnvReply) -> None:
        self._reply = reply

    def _take(self) -> Any:
        reply, self._reply = self._reply, None
        if reply is None:
            raise RuntimeError("HostedEnv: no reply was fetched for this call")
        self.ctx.tool_calls = max(self.ctx.tool_calls, reply.tool_calls)
        if reply.kind == "ok":
            return reply.value
        if reply.kind == "bound":
            raise BoundHit(*reply.value)
        if reply.kind == "killed":
            raise BoundHit("deadline", reply.value)
        raise RuntimeError(reply.value)

    def reset(self) -> list[Message]:
        return list(self._take())

    def step(self, model_text: str) -> StepResult:
        result: StepResult = self._take()
        return result

    def close(self) -> None:
        pass  # the worker's environment is closed by the sampler's batched `close` after the rollout


def _unverified(_: str) -> Score:
    raise RuntimeError("the driver's context does not verify: the environment's worker does")


class MultiTurnSampler:
    def __init__(
        self, env: EnvSpec, seed: int, tokenizer: Any, rollout: RolloutPool, rewards: RewardPoolGroup
    ):
        self.env, self.seed, self.rollout, self.rewards = env, seed, rollout, rewards
        self.template = ChatTemplate(tokenizer)
        self.close = self.template.assistant_close()  # the same for every trajectory: found once
        self.tokenizer = tokenizer

    def _envs(self, calls: list[EnvCall]) -> list[EnvReply]:
        return self.rewards.env_call(self.env, calls)

    def run_trajectories(
        self, items: list[TaskItem], seeds: list[int], k: int, sampling: Sampling | None = None
    ) -> TrajectoryBatch:
        """k trajectories of each item, run to their end: trajectory i is sample i % k of item i // k, its turn
        t sampled with seed `sample_seed(seeds[i // k], (i % k) * 64 + t)` (so a rerun samples the same), at
        the spec's sampling or `sampling` (evaluation). Trajectory i runs on environment slot i."""
        bounds: EnvBounds = self.env.bounds
        t_gen = t_env = 0.0
        each = [item for item in items for _ in range(k)]
        hosted = [HostedEnv(EnvContext(item, _unverified, bounds)) for item in each]
        t0 = time.perf_counter()
        resets = self._envs([EnvCall(i, "reset", item, bounds.deadline_s) for i, item in enumerate(each)])
        t_env += time.perf_counter() - t0
        max_new = sampling.max_new_tokens if sampling is not None else _max_new_tokens(self.rollout)
        runs = []
        for h, reply in zip(hosted, resets, strict=True):
            h.answer(reply)
            builder = TrajectoryBuilder(self.template, self.close)
            runs.append(TrajectoryRun(h, h.ctx, builder, max_new_tokens=max_new))
        versions: dict[int, int] = {}  # per trajectory: the oldest weights that sampled a turn of it
        turn = 0
        while True:
            live = [(i, req) for i, r in enumerate(runs) if (req := r.request()) is not None]
            if not live:
                break
            t0 = time.perf_counter()
            outs = self.rollout.generate(
                [list(req.prompt_ids) for _, req in live],
                1,
                [sample_seed(seeds[i // k], (i % k) * _TURN_SEEDS + turn) for i, _ in live],
                sampling,
            )
            t1 = time.perf_counter()
            samples = []
            for (i, req), (comp,) in zip(live, outs, strict=True):
                ids, lps = comp.token_ids[: req.max_tokens], comp.logprobs[: req.max_tokens]
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                samples.append(Sample(tuple(ids), tuple(lps), text))
                versions[i] = min(versions.get(i, comp.version), comp.version)
            steps = self._envs(
                [
                    EnvCall(i, "step", s.text, runs[i].ctx.time_left())
                    for (i, _), s in zip(live, samples, strict=True)
                ]
            )
            t_env += time.perf_counter() - t1
            t_gen += t1 - t0
            for (i, _), s, reply in zip(live, samples, steps, strict=True):
                hosted[i].answer(reply)
                runs[i].feed(s)
            turn += 1
        t0 = time.perf_counter()
        self._envs([EnvCall(i, "close", None, bounds.tool_timeout_s) for i in range(len(runs))])
        t_env += time.perf_counter() - t0
        return TrajectoryBatch(
            [r.result() for r in runs],
            [versions.get(i, self.rollout.version) for i in range(len(runs))],
            t_gen,
            t_env,
        )

    def generate_groups(
        self, prompts: list[Prompt], group_size: int, attempt: int
    ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        seeds = [derive_seed(self.seed, p.index, attempt) for p in prompts]
        out = self.run_trajectories([p.item for p in prompts], seeds, group_size)
        groups, metrics = group_trajectories(prompts, out.trajectories, out.versions, group_size)
        metrics.update({TIMING_GENERATE: out.generate_s, TIMING_ENV: out.env_s, TIMING_REWARD: 0.0})
        return groups, metrics


def _max_new_tokens(rollout: Any) -> int:
    return int(rollout.replica_spec.sampling.max_new_tokens)


def group_trajectories(
    prompts: list[Prompt], trajectories: list[Trajectory], versions: list[int], group_size: int
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """The groups that go into the batch, and the step's multi-turn counters (sums: a refill adds to them)."""
    m: dict[str, float] = dict.fromkeys(MT_STEP_COUNTERS, 0.0)
    groups = []
    for g, prompt in enumerate(prompts):
        trajs = trajectories[g * group_size : (g + 1) * group_size]
        for t in trajs:
            m[MT_TRAJECTORIES] += 1
            m[MT_TURNS] += t.turns
            m[MT_TOOL_CALLS] += t.tool_calls
            m[MT_TOOL_ERRORS] += t.tool_errors
            killed = t.end_reason == "deadline" and "killed" in t.detail  # its process killed at the deadline
            m[MT_TOOL_TIMEOUTS] += t.tool_timeouts + int(killed)
            m[MT_OBSERVATION_TOKENS] += t.context_tokens
            m[MT_MODEL_TOKENS] += t.model_tokens
            m[MT_BRIDGE_FAILURES] += t.end_reason == "bridge"
            if t.end_reason in BOUND_REASONS:
                m[f"{MT_BOUND_HITS}/{t.end_reason}"] += 1
        group = keep_rule(prompt, trajs, versions[g * group_size : (g + 1) * group_size])
        if group is None:
            m[MT_DROPPED_GROUPS] += 1
            m[MT_DROPPED_TRAJECTORIES] += len(trajs)
            continue
        m[MT_DROPPED_TRAJECTORIES] += group.keep.count(False)
        groups.append(group)
    return groups, m


def keep_rule(prompt: Prompt, trajs: list[Trajectory], versions: list[int]) -> TrajectoryGroup | None:
    """A group as the batch takes it, or None when it must be dropped: a trajectory without a model token
    (or whose first prompt differs from its siblings', so no shared prompt) leaves the group short of its
    G rows; fewer than 2 trajectories that did not fail leave nothing to centre over."""
    first = trajs[0].token_ids[: trajs[0].prompt_len]
    if any(t.model_tokens == 0 or t.token_ids[: t.prompt_len] != first for t in trajs):
        return None
    keep = [t.end_reason not in FAILED for t in trajs]
    if sum(keep) < 2:
        return None
    completions = [t.completion(v) for t, v in zip(trajs, versions, strict=True)]
    scores = [
        Score(t.reward, "ok" if k else "error", t.detail if not k else "")
        for t, k in zip(trajs, keep, strict=True)
    ]
    return TrajectoryGroup(
        dataclasses.replace(prompt, token_ids=list(first)), completions, scores, keep, list(trajs)
    )


def with_means(metrics: dict[str, float]) -> dict[str, float]:
    """The counters' per-trajectory mean: turns per trajectory."""
    n = metrics.get(MT_TRAJECTORIES, 0.0)
    return {MT_TURNS_PER_TRAJECTORY: metrics.get(MT_TURNS, 0.0) / n if n else 0.0}
