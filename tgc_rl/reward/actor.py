"""The Ray placement of a `RewardPool`: one actor owning the pool's worker processes.

Concurrency is bounded twice: `max_concurrency` score calls run in the actor at once (their samples
share the pool's workers), and `max_pending_calls` on the handle refuses further calls with
`ray.exceptions.PendingCallsLimitExceeded` instead of queueing without bound (back-pressure the
trainer sees). `score` returns its list of Scores through the object store.
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.util import metrics as ray_metrics

from tgc_rl.config import TaskSpec
from tgc_rl.envs import EnvSpec
from tgc_rl.reward.env_host import EnvCall, EnvHost, EnvReply
from tgc_rl.reward.pool import RewardPool
from tgc_rl.tasks.base import Score, TaskItem
from tgc_rl.tasks.grants import LOCAL_GRANTS, job_grants

DEFAULT_MAX_CONCURRENCY = 4
DEFAULT_MAX_PENDING_CALLS = 64


class RewardPoolService:
    """The actor's body; a plain class so that tests can also drive it without Ray."""

    def __init__(
        self,
        task: TaskSpec | dict[str, Any],
        seed: int = 0,
        max_pending: int = 10_000,
        grants: frozenset[str] = LOCAL_GRANTS,
    ):
        self.task = task if isinstance(task, TaskSpec) else TaskSpec.model_validate(task)
        self.pool = RewardPool(self.task, seed, max_pending=max_pending, grants=grants)
        self.seed, self.grants = seed, grants
        self.envs: EnvHost | None = None  # a multi-turn job's environments, started on its first call
        self._tags = {"task": self.task.name}
        self._count = ray_metrics.Counter(
            "tgc_reward_actor_verifications",
            "Verifications done by reward actors (verifications), by status.",
            tag_keys=("task", "status"),
        )
        self._batch_seconds = ray_metrics.Histogram(
            "tgc_reward_actor_batch_seconds",
            "Wall time of one score() batch in a reward actor (seconds).",
            boundaries=[0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300],
            tag_keys=("task",),
        )

    def ready(self) -> bool:
        return True

    def score(self, items: list[TaskItem], responses: list[str]) -> list[Score]:
        start = time.perf_counter()
        scores = self.pool.score(items, responses)
        self._batch_seconds.observe(time.perf_counter() - start, tags=self._tags)
        for status in ("ok", "timeout", "error"):
            n = sum(s.status == status for s in scores)
            if n:
                self._count.inc(n, tags={**self._tags, "status": status})
        return scores

    def env_call(self, env: EnvSpec | dict[str, Any], calls: list[EnvCall]) -> list[EnvReply]:
        """Multi-turn: calls on the job's environments, in worker processes of this actor (env_host.py)."""
        if self.envs is None:
            spec = env if isinstance(env, EnvSpec) else EnvSpec.model_validate(env)
            self.envs = EnvHost(self.task, spec, self.seed, self.grants)
        return self.envs.call(calls)

    def stats(self) -> dict[str, float]:
        return self.pool.stats()

    def worker_pids(self) -> list[int]:
        return self.pool.worker_pids + (self.envs.pids if self.envs is not None else [])

    def close(self) -> None:
        if self.envs is not None:
            self.envs.close()
        self.pool.close()


RewardPoolActor = ray.remote(num_cpus=1, max_concurrency=DEFAULT_MAX_CONCURRENCY)(RewardPoolService)  # type: ignore[call-overload]  # Ray's stubs lack actor options


def start_reward_pool_actor(
    task: TaskSpec,
    seed: int = 0,
    *,
    name: str | None = None,
    namespace: str | None = None,
    num_cpus: float | None = None,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    max_pending_calls: int = DEFAULT_MAX_PENDING_CALLS,
    label_selector: dict[str, str] | None = None,
    wait: bool = True,
    grants: frozenset[str] = LOCAL_GRANTS,
) -> Any:
    """Start a (named) reward actor and, with `wait`, block until its workers are up.

    `num_cpus` defaults to `task.reward_workers`: the worker processes are the actor's CPU use.
    `label_selector` places it on nodes with those Ray node labels (e.g. {"tgc/role": "reward"}).
    """
    if max_concurrency < 1 or max_pending_calls < 1:
        raise ValueError("max_concurrency and max_pending_calls must be >= 1")
    options: dict[str, Any] = {
        "num_cpus": task.reward_workers if num_cpus is None else num_cpus,
        "max_concurrency": max_concurrency,
        "max_pending_calls": max_pending_calls,
    }
    if name is not None:
        options["name"] = name
    if namespace is not None:
        options["namespace"] = namespace
    if label_selector:
        options["label_selector"] = label_selector
    handle = RewardPoolActor.options(**options).remote(task.model_dump(), seed, grants=frozenset(grants))
    if wait:
        ray.get(handle.ready.remote())
    return handle


class RewardPoolGroup:
    """The reward client: one or more reward actors (e.g. one per node) behind one `score`; a batch is cut
    into contiguous chunks, one per actor, scored in parallel, and put back together in order. The trainer
    holds one per job (and its evaluation uses the same one)."""

    def __init__(
        self,
        task: TaskSpec,
        seed: int = 0,
        actors: int = 2,
        name_prefix: str | None = None,
        **actor_options: Any,
    ):
        if actors < 1:
            raise ValueError(f"actors={actors}: a reward group needs at least one actor")
        self.handles = [
            start_reward_pool_actor(
                task, seed, name=f"{name_prefix}-{i}" if name_prefix else None, wait=False, **actor_options
            )
            for i in range(actors)
        ]
        ray.get([h.ready.remote() for h in self.handles])

    @classmethod
    def for_job(cls, task: TaskSpec, seed: int, job_name: str) -> RewardPoolGroup:
        """A job's reward client: one actor (verifier worker processes, sandboxed code) holding exactly the
        grants the operator gave this job."""
        return cls(task, seed, actors=1, name_prefix=f"{job_name}-reward", grants=job_grants())

    def score_refs(self, items: list[TaskItem], responses: list[str]) -> list[ray.ObjectRef]:
        """One object ref per non-empty chunk, in order; `ray.get` each for its Scores."""
        if len(items) != len(responses):
            raise ValueError(
                f"score(items, responses): got {len(items)} items and {len(responses)} "
                "responses; pass exactly one response per item"
            )
        n = len(self.handles)
        size = -(-len(items) // n) if items else 0
        return [
            h.score.remote(items[i : i + size], responses[i : i + size])
            for h, i in zip(self.handles, range(0, len(items), size or 1), strict=False)
        ]

    def score(self, items: list[TaskItem], responses: list[str]) -> list[Score]:
        return [s for chunk in ray.get(self.score_refs(items, responses)) for s in chunk]

    def env_call(self, env: EnvSpec, calls: list[EnvCall]) -> list[EnvReply]:
        """A multi-turn job's environment calls, on the first actor's environment workers."""
        result: list[EnvReply] = ray.get(self.handles[0].env_call.remote(env.model_dump(), calls))
        return result

    def stats(self) -> dict[str, float]:
        """Counts summed over the actors; latency quantiles and queue depth are the worst actor's."""
        merged: dict[str, float] = {}
        for stats in ray.get([h.stats.remote() for h in self.handles]):
            for key, value in stats.items():
                worst = "latency" in key or "queue" in key
                merged[key] = max(merged.get(key, value), value) if worst else merged.get(key, 0.0) + value
        return merged

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the worker processes each actor owns, then the actors (killed even if a close hangs)."""
        try:
            ray.get([h.close.remote() for h in self.handles], timeout=timeout_s)
        finally:
            for h in self.handles:
                ray.kill(h)
