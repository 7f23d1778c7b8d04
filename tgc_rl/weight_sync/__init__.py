"""Each step's weights from the learner to the rollout replicas, both routes in one place.

- `flat`: publish. Learner rank 0 packs the state dict into one flat buffer that goes into Ray's object store
  once; every replica maps it without a copy (`resources.weight_sync: object_store`, any engine).
- `broadcast` (+ `gloo`): transfer. vLLM's weight-transfer protocol from learner rank 0 straight into every
  vLLM replica: NCCL between GPUs, a gloo stand-in on CPU (`resources.weight_sync: broadcast`). vLLM's
  trainer-side engine drives the receivers through a client object, so this is the one place where the
  learner's ranks reach the replicas.
- `vllm_loader`: load. The vLLM worker extension that loads a published buffer or receives a broadcast in
  place, tied embeddings included.
- `sync.WeightSync`: the driver's choice between the routes every step, with the object store as the fallback
  that also replaces dead replicas.
"""

from tgc_rl.weight_sync.sync import WeightSync

__all__ = ["WeightSync"]
