"""The learner group: `resources.learner_ranks` Ray actors, each hosting one `Learner` rank of one
torch.distributed group (gloo on CPU, NCCL on GPU). The driver talks to the group; the group fans every
call out to all ranks, because every learner call is a collective.

Batches travel once through the object store (one `ray.put`, every rank reads the same object) and
published weights are put once, by rank 0. A TrainBatch comes checked from `SampledBatch.with_advantages`,
so no rank refuses one inside a collective. If any rank fails, the others would wait in a collective until
the timeout, so the group kills all its actors and raises: the step stops cleanly and the job can resume
from its last checkpoint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch

from tgc_rl.batch import SampledBatch, TrainBatch
from tgc_rl.config import JobSpec
from tgc_rl.learner.learner import Learner
from tgc_rl.learner.sharding import free_port
from tgc_rl.learner.spec import LearnerSpec
from tgc_rl.placement import Placement
from tgc_rl.resources import check_learner_fits
from tgc_rl.startup import set_torch_threads

log = logging.getLogger(__name__)


class LearnerGroupError(RuntimeError):
    """A learner rank failed; the group has been shut down (resume from the last checkpoint)."""


class _LearnerRank:
    """Ray actor body: one Learner rank. Named and repr'd so the dashboard shows job and rank."""

    def __init__(self, spec: LearnerSpec, model_path: str, job_name: str, rank: int, world_size: int):
        self.spec, self.model_path = spec, Path(model_path)
        self.job_name, self.rank, self.world_size = job_name, rank, world_size
        self.learner: Learner | None = None
        self.sender: Any = None  # weight broadcast to the rollout replicas (resources.weight_sync: broadcast)
        set_torch_threads(spec.threads)

    def __repr__(self) -> str:  # Ray shows this as the actor's name in the dashboard and logs
        return f"Learner({self.job_name}, rank {self.rank}/{self.world_size})"

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port for the process group."""
        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)

    def setup(self, master_addr: str, master_port: int) -> None:
        self.learner = Learner(
            self.spec, self.model_path, self.rank, self.world_size, master_addr, master_port
        )

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return self._learner().train_step(batch)

    def logprobs(self, batch: SampledBatch) -> torch.Tensor | None:
        out = self._learner().logprobs(batch)
        return out if self.rank == 0 else None

    def gradients(self, batch: TrainBatch) -> dict[str, torch.Tensor] | None:
        out = self._learner().gradients(batch)
        return out if self.rank == 0 else None

    def publish(
        self, pack: Callable[[dict], Any] | None, adapter: bool = False
    ) -> list[ray.ObjectRef] | None:
        learner = self._learner()
        state = learner.adapter_state_dict() if adapter else learner.full_state_dict()
        if self.rank != 0:
            return None
        # Wrapped in a list so that the caller receives the reference itself, not a copy of the weights.
        return [ray.put(pack(state) if pack is not None else state)]

    def canary_logprobs(self, sequence: list[int], prompt_len: int) -> list[float] | None:
        out = self._learner().canary_logprobs(sequence, prompt_len)
        return out if self.rank == 0 else None

    def open_broadcast(
        self, make_sender: Callable[[str, int, int, Learner], Any], addr: str, port: int
    ) -> None:
        """Join a broadcast group with the rollout replicas: `make_sender(addr, port, rank, learner)` returns this
        rank's sender (tgc_rl.weight_sync.broadcast.BroadcastSender); a previous group's sender is dropped."""
        self.sender = make_sender(addr, port, self.rank, self._learner())

    def broadcast(self, version: int) -> str | None:
        """None, or why sending failed (e.g. a replica died): this rank stays up and the driver falls back."""
        if self.sender is None:
            raise RuntimeError("broadcast: no weight broadcast group; call LearnerGroup.open_broadcast first")
        try:
            self.sender.send(self._learner(), version)
        except Exception as e:  # the gather (the collective) is done; only the send to the replicas failed
            self.sender = None
            return f"{type(e).__name__}: {e}"
        return None

    def save(self, path: str) -> None:
        self._learner().save(Path(path))

    def load(self, path: str) -> None:
        self._learner().load(Path(path))

    def close(self) -> None:
        if self.learner is not None:
            self.learner.close()
            self.learner = None

    def _learner(self) -> Learner:
        if self.learner is None:
            raise RuntimeError(f"{self!r}: no learner (setup() not called, or closed)")
        return self.learner


class LearnerGroup:
    def __init__(self, spec: JobSpec, model_path: Path, job_name: str, *, startup_timeout_s: float = 600.0):
        if not ray.is_initialized():
            raise RuntimeError(
                "LearnerGroup needs a running Ray: call ray.init() (or run as a Ray job) first"
            )
        r = spec.resources
        self.job_name = job_name
        self.world_size = r.learner_ranks
        # Calls reach every rank in one order even from two threads (async rollout + training): each call is a
        # collective, and ranks that ran two of them in different orders would deadlock.
        self._submit = threading.Lock()
        check_learner_fits(spec, ray.cluster_resources())
        self.placement = Placement(
            job_name,
            "learner",
            r.learner_placement,
            self.world_size,
            r.cpus_per_learner,
            r.gpus_per_learner,
            r.learner_custom_resources,
            startup_timeout_s,
        )
        actor_cls = ray.remote(_LearnerRank)
        rank_spec = LearnerSpec.of(spec)  # what the ranks see of the job
        # Ray's stubs type a handle as the class itself, whose methods have no `.remote`
        self.actors: list[Any] = [
            actor_cls.options(
                name=f"{job_name}-learner-{rank}",
                num_cpus=r.cpus_per_learner,
                num_gpus=r.gpus_per_learner,
                max_restarts=0,
                max_concurrency=1,
                **self.placement.options(rank),
            ).remote(rank_spec, str(model_path), job_name, rank, self.world_size)
            for rank in range(self.world_size)
        ]
        try:
            addr, port = self._get([self.actors[0].rendezvous.remote()], startup_timeout_s)[0]
            self._get([a.setup.remote(addr, port) for a in self.actors], startup_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    # -- collectives ----------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One rollout batch (all its groups) -> the learner's optimizer steps; returns rank 0's metrics."""
        ref = ray.put(batch)
        return self._all(lambda a: a.train_step.remote(ref))[0]

    def logprobs(self, batch: SampledBatch) -> torch.Tensor:
        ref = ray.put(batch)
        return self._all(lambda a: a.logprobs.remote(ref))[0]

    def gradients(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """Full-batch gradient at the current weights, no update (tests and diagnostics)."""
        ref = ray.put(batch)
        return self._all(lambda a: a.gradients.remote(ref))[0]

    def publish_weights(
        self, pack: Callable[[dict], Any] | None = None, adapter: bool = False
    ) -> ray.ObjectRef:
        """The full state dict (HF names, model dtype, tied duplicates left out; with `adapter` the LoRA
        adapter alone, PEFT names) put into the object store once by rank 0; `pack` optionally converts it
        first (e.g. tgc_rl.weight_sync.flat.FlatWeights.from_state_dict)."""
        return self._all(lambda a: a.publish.remote(pack, adapter))[0][0]

    def canary_logprobs(self, sequence: list[int], prompt_len: int) -> list[float]:
        """The learner's log-probs of sequence[prompt_len:] at temperature 1 (the weight sync's canary)."""
        return self._all(lambda a: a.canary_logprobs.remote(sequence, prompt_len))[0]

    def open_broadcast(self, make_sender: Callable[[str, int, int, Any], Any]) -> None:
        """Open a weight broadcast group with the rollout replicas, rendezvous at a free port on rank 0's node:
        every rank calls `make_sender(address, port, rank, learner)`, e.g. partial(BroadcastSender, client)."""
        addr, port = self._get([self.actors[0].rendezvous.remote()])[0]
        self._all(lambda a: a.open_broadcast.remote(make_sender, addr, port))

    def broadcast_weights(self, version: int) -> str | None:
        """Send the current weights through the group `open_broadcast` made, stamped with `version`. Returns
        None, or why the send failed (a replica died): the group is closed then, the learner stays up."""
        return next((e for e in self._all(lambda a: a.broadcast.remote(version)) if e), None)

    def save(self, path: Path) -> None:
        self._all(lambda a: a.save.remote(str(path)))

    def load(self, path: Path) -> None:
        self._all(lambda a: a.load.remote(str(path)))

    # -- lifecycle ------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Leave the process group and kill every rank's actor (idempotent)."""
        actors, self.actors = getattr(self, "actors", []), []
        if actors:
            try:
                ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=30)
            except Exception as e:  # a dead rank cannot close; killing it below is what matters
                log.warning("learner close failed: %s", e)
        for a in actors:
            ray.kill(a, no_restart=True)
        if getattr(self, "placement", None) is not None:
            self.placement.remove()

    def __enter__(self) -> LearnerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- internals ------------------------------------------------------------------------------------
    def _all(self, call: Callable[[Any], ray.ObjectRef]) -> list[Any]:
        if not self.actors:
            raise LearnerGroupError("the learner group has been shut down; start a new one")
        with self._submit:
            refs = [call(a) for a in self.actors]
        return self._get(refs)

    def _get(self, refs: list[ray.ObjectRef], timeout: float | None = None) -> list[Any]:
        """Results in order; on the first failing rank, kill the whole group (peers would hang) and raise."""
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not done:
                self.shutdown()
                raise LearnerGroupError(f"learner ranks did not answer within {timeout} s; group shut down")
            try:
                ray.get(done[0])
            except Exception as e:
                self.shutdown()
                raise LearnerGroupError(f"a learner rank failed, group shut down: {e}") from e
        return ray.get(refs)
