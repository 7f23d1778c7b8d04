"""Each step's weights from the learner group to the rollout replicas (`resources.weight_sync`).

object_store: learner rank 0 puts one flat buffer into the object store; every replica loads it in place.
broadcast: learner rank 0 sends straight into every vLLM replica (NCCL on GPU, gloo on CPU; see
tgc_rl/weight_sync/broadcast.py). The broadcast group holds the replicas that were alive when it was opened, so
the first sync, the first after a replica was replaced and one whose broadcast failed (a replica died between
generation and sync) go through the object store and then (re)open the group; a replica replaced in the middle
of a step fetches the current weights through the object store too. A replica dying in the middle of a
broadcast is not handled on GPU: NCCL ranks would wait for it (resume from the last checkpoint).

With `model.lora` only the adapter travels where the engine is vLLM (it serves it as a new versioned adapter);
the transformers engine gets the merged weights through the same path. After every LoRA sync a canary scores a
fixed sequence on the engine and on the learner: a sync that did not reach the engine fails the job
(docs/lora.md).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from tgc_rl.config import JobSpec

log = logging.getLogger("tgc.trainer")

# Token ids below 252 exist in any vocabulary a causal LM here has; the sequence is fixed, so one engine's
# score of it moves only when its weights do.
CANARY_TOKENS = [(i * 37 + 11) % 251 + 1 for i in range(32)]


class SyncCanaryError(RuntimeError):
    """The engine's log-probs after a sync are not the learner's: the weights did not reach it."""


def canary_sequence(spec: JobSpec) -> tuple[list[int], int]:
    """The canary's tokens (within the engine's context) and its prompt length."""
    n = min(len(CANARY_TOKENS), spec.sampling.max_prompt_tokens + spec.sampling.max_new_tokens)
    return CANARY_TOKENS[:n], max(1, n // 4)


class WeightSync:
    def __init__(self, spec: JobSpec, learner: Any, rollout: Any):
        self.learner, self.rollout = learner, rollout
        self.broadcast = spec.resources.weight_sync == "broadcast"
        self._group_restarts: int | None = None  # the pool's restart count when the group was opened
        self._bytes = 0.0
        if self.broadcast:
            rollout.weights_source = self._publish
        self.lora = spec.model.lora
        self.adapter = self.lora is not None and rollout.kind == "vllm"
        self.canary = canary_sequence(spec)
        if self.lora is not None:
            log.info(
                "LoRA weight sync: %s",
                "the adapter alone, served by vLLM as a new adapter per version"
                if self.adapter
                else f"merged weights (the {rollout.kind} engine serves no LoRA adapters)",
            )

    def __call__(self, version: int) -> dict[str, float]:
        """Sync `version`; returns seconds, bytes and whether it went by broadcast (with LoRA, the canary's
        mean absolute log-prob difference; SyncCanaryError when it is over model.lora.canary_tolerance)."""
        out = self._sync(version)
        if self.lora is not None:
            out["canary_logprob_diff"] = self.check_canary(version, self.lora.canary_tolerance)
        return out

    def check_canary(self, version: int, tolerance: float) -> float:
        """Score the fixed sequence on the engine and on the learner; their mean absolute difference."""
        tokens, prompt_len = self.canary
        engine = self.rollout.score([tokens], prompt_len)[0]
        learner = self.learner.canary_logprobs(tokens, prompt_len)
        diff = sum(abs(a - b) for a, b in zip(engine, learner, strict=True)) / len(engine)
        if not diff <= tolerance:  # NaN fails too
            raise SyncCanaryError(
                f"weight sync canary: after syncing version {version} the engine's log-probs of a fixed sequence "
                f"differ from the learner's by {diff:.4g} per token (model.lora.canary_tolerance {tolerance}): "
                "the new weights did not reach the rollout engine, which would keep sampling an old policy"
            )
        return diff

    def _sync(self, version: int) -> dict[str, float]:
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
        from tgc_rl.weight_sync.flat import FlatWeights

        if self.adapter:
            from tgc_rl.weight_sync.adapter import AdapterWeights

            assert self.lora is not None
            pack = functools.partial(AdapterWeights.pack, rank=self.lora.rank, alpha=self.lora.alpha)
            return self.learner.publish_weights(pack, adapter=True)
        # one flat buffer in the object store: replicas map it without a copy
        return self.learner.publish_weights(FlatWeights.from_state_dict)

    def _open(self) -> None:
        from tgc_rl.weight_sync.broadcast import BroadcastSender

        client = self.rollout.sync_client()
        self.learner.open_broadcast(functools.partial(BroadcastSender, client))
        self._group_restarts = self.rollout.restarts
