"""What a rollout replica needs of the job spec: its slice, built once on the driver (`RolloutSpec.of`).

The replica's actor and its engine see these fields only, never the whole JobSpec; `auto` values that depend
on the host (`model.dtype`, `engine`) stay unresolved here and are resolved by the replica on its own host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tgc_rl.config import JobSpec, ModelSpec, SamplingSpec


@dataclass(frozen=True)
class RolloutSpec:
    model: ModelSpec  # the tokenizer's eos/pad ids, and model.dtype (`auto` kept)
    sampling: SamplingSpec  # the step's sampling and the prompt/response length limits
    seed: int  # the engine's seed
    engine: Literal["auto", "vllm", "hf"]  # resources.rollout_engine (`auto`: vLLM where it is installed)
    broadcast: bool  # resources.weight_sync is `broadcast` (only vLLM can receive one)
    gpus: float  # resources.gpus_per_rollout
    memory_fraction: float  # resources.vllm_memory_fraction
    # resources.rollout_sharing is `shared`: the adapter goes to a shared engine (shared.py)
    shared: bool = False

    @classmethod
    def of(cls, job: JobSpec) -> RolloutSpec:
        r = job.resources
        return cls(
            model=job.model,
            sampling=job.sampling,
            seed=job.seed,
            engine=r.rollout_engine,
            broadcast=r.weight_sync == "broadcast",
            gpus=r.gpus_per_rollout,
            memory_fraction=r.vllm_memory_fraction,
            shared=r.rollout_sharing == "shared",
        )
