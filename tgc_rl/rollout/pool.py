"""The rollout replicas of one job as named Ray actors: split prompts, sync weights, replace dead replicas.

A replica that dies (its process killed, its node lost) is started again under the same name, loaded with the
latest published weights, and the prompts it was working on are sent to it again; `stats()["restarts"]`
counts these. Prompts are split whole (all n samples of a prompt on one replica) and in order, so a given
replica count always sends the same prompts to the same replica.

With `resources.rollout_sharing: shared` the one replica is the job's tenant on a shared LoRA engine
(tgc_rl/rollout/shared.py): the same calls, tagged with the tenant; a dead shared engine is replaced the same
way (created again, or found where another job already did, and loaded with this job's latest adapter), and
shutting down detaches the job instead of killing the engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from tgc_rl.batch import Completion
from tgc_rl.config import JobSpec
from tgc_rl.placement import Placement
from tgc_rl.rollout.actor import RolloutActor
from tgc_rl.rollout.engine import Sampling, engine_kind
from tgc_rl.rollout.spec import RolloutSpec
from tgc_rl.weight_sync.flat import FlatWeights, publish_weights

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # tries of one call on one replica slot (the first one plus restarts)
_NAME_WAIT_S = 30.0  # how long a restarted replica waits for its dead predecessor's name to be released


def split_evenly(count: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) ranges of `count` items over `parts` workers, in order, sizes differing by at most 1."""
    bounds = [count * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


class RolloutPool:
    def __init__(self, spec: JobSpec, model_path: Path | str, job_name: str):
        if not ray.is_initialized():
            raise RuntimeError("RolloutPool needs a running Ray: call ray.init(...) first")
        self.resources = r = spec.resources
        self.replica_spec = RolloutSpec.of(spec)  # what the replicas see of the job
        self.model_path = str(model_path)
        self.job_name = job_name
        self.kind = engine_kind(self.replica_spec)  # fails here, before any actor starts, if vLLM is missing
        self.shared = self.replica_spec.shared
        self.replicas = r.rollout_replicas
        self.threads = spec.actor_threads("rollout")
        self.version = 0
        self.restarts = 0
        self._weights: ray.ObjectRef | None = None  # the latest published weights, loaded into every restart
        self._weights_version = 0  # the policy version of `_weights`
        # Where a restarted replica gets current weights when the last ones came by broadcast, not through the
        # object store (set by the trainer for resources.weight_sync: broadcast): () -> ObjectRef of a state dict.
        self.weights_source: Callable[[], ray.ObjectRef] | None = None
        self._lock = threading.Lock()
        self._last_sync: dict[str, float] = {}
        self._pids: dict[int, list[int]] = {}
        self.placement = Placement(
            job_name,
            "rollout",
            r.rollout_placement,
            self.replicas,
            r.cpus_per_rollout,
            r.gpus_per_rollout,
            r.rollout_custom_resources,
        )
        self.actors: list[Any] = [self._create(i) for i in range(self.replicas)]
        try:
            for i, info in enumerate(ray.get([a.ready.remote() for a in self.actors])):
                self._track(i, info)
        except Exception:
            self.shutdown()
            raise

    # -- placement ----------------------------------------------------------------------------------
    def _create(self, i: int):
        r = self.resources
        if self.shared:
            from tgc_rl.rollout.shared import EngineResources, attach

            need = EngineResources(
                r.cpus_per_rollout, r.gpus_per_rollout, dict(r.rollout_custom_resources), self.threads
            )
            return attach(self.replica_spec, self.model_path, self.job_name, need)
        cls = ray.remote(RolloutActor)
        name = f"{self.job_name}-rollout-{i}"
        deadline = time.monotonic() + _NAME_WAIT_S
        while True:
            try:
                return cls.options(
                    name=name,
                    num_cpus=r.cpus_per_rollout,
                    num_gpus=r.gpus_per_rollout,
                    max_restarts=0,
                    max_concurrency=1,  # calls run in order: a weight update waits for the generation before it
                    **self.placement.options(i),
                ).remote(self.replica_spec, self.model_path, self.job_name, i, self.threads)
            except ValueError as e:  # the dead replica's name is released a moment after it dies
                if "already taken" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _replace(self, i: int, dead) -> Any:
        """Start replica i again (once per death, whichever thread sees it first) with the latest weights."""
        with self._lock:
            if self.actors[i] is not dead:
                return self.actors[i]
            log.warning("rollout replica %s-rollout-%d died; restarting it", self.job_name, i)
            try:
                if not self.shared:  # a shared engine's death is seen by every tenant; nothing to kill
                    ray.kill(dead, no_restart=True)
            except Exception:  # already gone
                pass
            actor = self._create(i)
            info = ray.get(actor.ready.remote())
            if self._weights_version != self.version and self.weights_source is not None:
                self._weights, self._weights_version = self.weights_source(), self.version
            if self._weights is not None:
                ray.get(actor.update_weights.remote([self._weights], self.version))
            self._track(i, info)
            self.actors[i] = actor
            self.restarts += 1
            return actor

    def _call_all(self, calls: dict[int, Callable[[Any], ray.ObjectRef]]) -> dict[int, Any]:
        """Run calls[i](actor i) on its replica; a replica that dies is replaced and its call sent again."""
        attempts = dict.fromkeys(calls, 1)
        handles = {i: self.actors[i] for i in calls}
        pending = {calls[i](handles[i]): i for i in calls}
        results: dict[int, Any] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done[0])
            try:
                results[i] = ray.get(done[0])
            except RayActorError:
                if attempts[i] >= MAX_ATTEMPTS:
                    raise RuntimeError(
                        f"rollout replica {self.job_name}-rollout-{i} died {attempts[i]} times on one call; "
                        "see its Ray worker log (often out of memory: lower resources.vllm_memory_fraction)"
                    ) from None
                attempts[i] += 1
                handles[i] = self._replace(i, handles[i])
                pending[calls[i](handles[i])] = i
        return results

    # -- the trainer's calls ---------------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], n: int, seeds: list[int], sampling: Sampling | None = None
    ) -> list[list[Completion]]:
        if len(seeds) != len(prompts):
            raise ValueError(
                f"generate: got {len(prompts)} prompts but {len(seeds)} seeds; pass one seed per prompt"
            )

        def share(a: int, b: int) -> Callable[[Any], ray.ObjectRef]:
            return lambda h: h.generate.remote(prompts[a:b], n, seeds[a:b], sampling)

        calls = {
            i: share(a, b) for i, (a, b) in enumerate(split_evenly(len(prompts), self.replicas)) if b > a
        }
        results = self._call_all(calls)
        return [c for i in sorted(results) for c in results[i]]

    def update_weights(
        self, weights_ref: ray.ObjectRef | Mapping | FlatWeights, version: int
    ) -> dict[str, float]:
        """Every replica loads the same object-store weights in parallel; returns sync seconds and bytes."""
        if not isinstance(weights_ref, ray.ObjectRef):
            weights_ref = (
                publish_weights(weights_ref) if isinstance(weights_ref, Mapping) else ray.put(weights_ref)
            )
        t0 = time.perf_counter()
        with self._lock:  # a replica restarted from now on loads these weights
            self._weights, self.version = weights_ref, int(version)
            self._weights_version = self.version
        results = self._call_all(
            {i: (lambda h: h.update_weights.remote([weights_ref], version)) for i in range(self.replicas)}
        )
        sync = {
            "sync_s": time.perf_counter() - t0,
            "bytes": float(results[0]["bytes"]),
            "get_s": max(r["get_s"] for r in results.values()),
            "load_s": max(r["load_s"] for r in results.values()),
        }
        self._last_sync = sync
        return sync

    def weights_broadcast(self, version: int, seconds: float) -> None:
        """Record that every replica received `version` by broadcast (see `sync_client`)."""
        with self._lock:
            self.version = int(version)
            self._last_sync = {**self._last_sync, "sync_s": seconds}

    def score(self, sequences: list[list[int]], prompt_len: int | list[int]) -> list[list[float]]:
        return self._call_all({0: lambda h: h.score.remote(sequences, prompt_len)})[0]

    def sync_client(self):
        """A client for vLLM's native GPU weight transfer into these replicas (see tgc_rl/weight_sync/broadcast.py)."""
        from tgc_rl.weight_sync.broadcast import ReplicaSyncClient

        return ReplicaSyncClient(self.actors, max(1, int(self.resources.gpus_per_rollout)))

    def stats(self) -> dict[str, float]:
        per = []
        for a in self.actors:
            try:
                per.append(ray.get(a.stats.remote()))
            except RayActorError:  # a dead replica is replaced on the next call; its counters are lost
                pass
        gen_s = sum(s["generate_s"] for s in per)
        out = {
            "replicas": float(self.replicas),
            "restarts": float(self.restarts),
            "version": float(self.version),
            "tokens": float(sum(s["tokens"] for s in per)),
            "tokens_per_replica_s": sum(s["tokens"] for s in per) / gen_s if gen_s else 0.0,
        }
        # the last weight sync: seconds end to end, in the slowest replica's ray.get and load, and its bytes
        out.update({("sync_s" if k == "sync_s" else f"sync_{k}"): v for k, v in self._last_sync.items()})
        return out

    def _track(self, i: int, info: dict[str, Any]) -> None:
        """Record replica i's processes for leak checks; not a shared engine's, which is not this job's process
        (it outlives the job)."""
        if not self.shared:
            self._pids[i] = [info["pid"], *info["children"]]

    def pids(self) -> list[int]:
        """Processes of the replicas (actor workers and anything they started), for leak checks; none for a
        shared engine, which outlives the job by its idle grace."""
        return [p for ps in self._pids.values() for p in ps]

    def shutdown(self) -> None:
        """Close every engine and kill its actor; the replicas' processes exit. A shared engine's tenant
        detaches instead (its adapter is dropped; the engine exits after its idle grace if no job remains)."""
        actors, self.actors = self.actors, []
        closing = []
        for a in actors:
            try:
                closing.append(a.close.remote())
            except Exception:
                pass
        try:
            # a tenant's detach waits for the other tenants' calls queued before it on the shared engine
            ray.wait(closing, num_returns=len(closing), timeout=300 if self.shared else 60)
        except Exception:
            pass
        if not self.shared:  # a tenant's close detached it; the shared engine lives on for the others
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # already dead
                    pass
        self.placement.remove()
