"""What a learner rank needs of the job spec: its slice, built once on the driver (`LearnerSpec.of`).

The rank's actor and its `Learner` see these fields only, never the whole JobSpec; `auto` values that depend
on the host (`model_dtype`) stay unresolved here and are resolved by the rank on its own host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlcore import ObjectiveConfig

if TYPE_CHECKING:  # annotations only: a LearnerSpec built without a JobSpec needs no pydantic (gpu-check)
    from tgc_rl.config import JobSpec, LoraSpec, OptimSpec


@dataclass(frozen=True)
class LearnerSpec:
    objective: str  # rlcore preset name (objective.name)
    # the resolved, frozen knobs (JobSpec.objective_config(): overrides and the async default applied): ranks
    # build their Objective from it without resolving the overrides again
    objective_config: ObjectiveConfig
    optim: OptimSpec  # the learner's own section, whole
    model_dtype: str  # model.dtype, `auto` kept (tgc_rl.config.resolve_dtype, on the rank's host)
    tokenizer: str | None  # model.tokenizer: saved beside a checkpoint's weights (None: the model's own)
    steps: int  # the LR schedule's length in rollout batches
    seed: int  # reshuffles of mini-batches across epochs
    group_size: int  # G, for the diagnostics
    temperature: float  # sampling.temperature: log-probs of the distribution the tokens were drawn from
    max_new_tokens: int  # sampling.max_new_tokens: the length of length-normalised losses
    save_optimizer: bool  # checkpoint.save_optimizer
    gpus: float  # resources.gpus_per_learner
    threads: int  # torch threads of the rank (JobSpec.actor_threads), capped by the CPUs it may run on
    lora: LoraSpec | None = None  # model.lora: train adapters on the frozen base (tgc_rl/learner/lora.py)

    @classmethod
    def of(cls, job: JobSpec) -> LearnerSpec:
        return cls(
            objective=job.objective.name,
            objective_config=job.objective_config(),
            optim=job.optim,
            model_dtype=job.model.dtype,
            tokenizer=job.model.tokenizer,
            steps=job.steps,
            seed=job.seed,
            group_size=job.group_size,
            temperature=job.sampling.temperature,
            max_new_tokens=job.sampling.max_new_tokens,
            save_optimizer=job.checkpoint.save_optimizer,
            gpus=job.resources.gpus_per_learner,
            threads=job.actor_threads("learner"),
            lora=job.model.lora,
        )
