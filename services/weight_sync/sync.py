"""Each step's weights from the learner group to the rollout replicas (`resources.weight_sync`).

object_store: learner rank 0 puts one flat buffer into the object store; every replica loads it in place.
broadcast: learner rank 0 sends straight into every vLLM replica (NCCL on GPU, gloo on CPU; see
services/weight_sync/broadcast.py). The broadcast group holds the replicas that were alive when it was opened, so
the first sync, the first after a replica was replaced and one whose broadcast failed (a replica died between
generation and sync) go through the object store and then (re)open the group; a replica replaced in the middle
of a step fetches the current weights through the object store too. A replica dying in the middle of a
broadcast is not handled on GPU: NCCL ranks would wait for it (resume from the last checkpoint).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from services.config import JobSpec

log = logging.getLogger("tgc.trainer")


class WeightSync:
    def __init__(self, spec: JobSpec, learner: Any, rollout: Any):
        self.learner, self.rollout = learner, rollout
        self.broadcast = spec.resources.weight_sync == "broadcast"
        self._group_restarts: int | None = None  # the pool's restart count when the group was opened
        self._bytes = 0.0
        if self.broadcast:
            rollout.weights_source = self._publish

    def __call__(self, version: int) -> dict[str, float]:
        """Sync `version`; returns seconds, bytes and whether it went by broadcast."""
        if self.broadcast and self._group_restarts == self.rollout.restarts:
            t0 = time.perf_counter()
            failure = self.learner.broadcast_weights(version)
            seconds = time.perf_counter() - t0
            if failure is None:
                self.rollout.weights_broadcast(version, seconds)
                return {"sync_s": seconds, "bytes": self._bytes, "broadcast": 1.0}
            log.warning(
                "weight broadcast of version %d failed (%s); syncing through the object store, which "
                "replaces dead replicas, and reopening the group",
                version,
                failure,
            )
        out = self.rollout.update_weights(self._publish(), version)
        self._bytes = float(out.get("bytes", 0.0))
        if self.broadcast:
            self._open()
        return {**out, "broadcast": 0.0}

    def _publish(self):
        from services.weight_sync.flat import FlatWeights

        # one flat buffer in the object store: replicas map it without a copy
        return self.learner.publish_weights(FlatWeights.from_state_dict)

    def _open(self) -> None:
        from services.weight_sync.broadcast import BroadcastSender

        client = self.rollout.sync_client()
        self.learner.open_broadcast(functools.partial(BroadcastSender, client))
        self._group_restarts = self.rollout.restarts
