"""The job spec itself (`JobSpec`) and its errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rlcore import ObjectiveConfig, resolve
from tgc_rl.config.base import (
    BUILTIN_MODEL_SOURCES,
    MAX_GROUP_SIZE,
    MAX_PROMPTS_PER_STEP,
    MAX_SEED,
    MAX_STEPS,
    _Strict,
    check_free_form,
    is_entry_point,
)
from tgc_rl.config.model import ModelSpec
from tgc_rl.config.sections import (
    IBPO_PRESET,
    AsyncSpec,
    CheckpointSpec,
    EvalSpec,
    IbpoSpec,
    ObjectiveSpec,
    OptimSpec,
    ResourceSpec,
    SamplingSpec,
    TracesSpec,
    TrackerSpec,
    async_objective_overrides,
)
from tgc_rl.config.task import AnyTask, TaskSpec, field_path
from tgc_rl.envs.registry import EnvSpec
from tgc_rl.tasks.dataset import DatasetParams
from tgc_rl.tasks.params import TaskParams


class JobSpec(_Strict):
    """A whole RL job: model, task, objective, batch shape, optimizer, resources, checkpoints."""

    name: str = Field("tgc-job", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    model: ModelSpec = Field(default_factory=ModelSpec)
    task: AnyTask = Field(default_factory=TaskSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    optim: OptimSpec = Field(default_factory=OptimSpec)
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    async_: AsyncSpec = Field(default_factory=AsyncSpec, alias="async")
    eval: EvalSpec | None = Field(
        None,
        description="Held-out evaluation at the start, every N steps and at the end (`eval/...` metrics).",
    )
    ibpo: IbpoSpec | None = Field(
        None,
        description="IBPO compare-and-correct credit (`ibpo/...` metrics); on by "
        "default (mask symmetric) with objective `ibpo_cp`.",
    )
    traces: TracesSpec = Field(
        default_factory=TracesSpec,
        description="Rollout traces: a bounded sample of each step's trajectories.",
    )
    env: EnvSpec | None = Field(
        None,
        description="Multi-turn: the environment each trajectory runs in (name, params, bounds; "
        "docs/multi_turn.md). None: single-turn.",
    )
    trackers: list[TrackerSpec] = Field(
        default_factory=list,
        max_length=2,
        description="Experiment trackers beside metrics.jsonl: `[mlflow]`, `[wandb]` or both (each at most once); "
        "where they log comes from the operator's environment.",
    )
    group_size: int = Field(8, ge=2, le=MAX_GROUP_SIZE, description="G: responses sampled per prompt.")
    prompts_per_step: int = Field(8, ge=1, le=MAX_PROMPTS_PER_STEP, description="Groups per optimizer step.")
    steps: int = Field(
        20, ge=0, le=MAX_STEPS, description="Rollout/update iterations (0: evaluate only, needs `eval`)."
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seeds data order, sampling and init.")
    dynamic_sampling: bool = Field(
        False, description="Drop groups whose rewards are all equal and refill (DAPO); max 4 refill rounds."
    )

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False
    )

    @model_validator(mode="before")
    @classmethod
    def _ibpo_preset(cls, data: Any) -> Any:
        # objective ibpo_cp means IBPO: without an `ibpo` section it runs with the section's defaults
        objective = data.get("objective") if isinstance(data, dict) else None
        if isinstance(objective, dict) and objective.get("name") == IBPO_PRESET and data.get("ibpo") is None:
            data = {**data, "ibpo": {"mask": "symmetric"}}
        return data

    @field_validator("env", mode="before")
    @classmethod
    def _env_params_free_form(cls, v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("params"), dict):
            check_free_form(v["params"], "env.params")
        return v

    @field_validator("trackers", mode="before")
    @classmethod
    def _tracker_names(cls, v: Any) -> Any:
        # `trackers: [mlflow]` is short for `[{kind: mlflow}]`
        return [{"kind": t} if isinstance(t, str) else t for t in v] if isinstance(v, list) else v

    @field_validator("trackers")
    @classmethod
    def _each_tracker_once(cls, v: list[TrackerSpec]) -> list[TrackerSpec]:
        kinds = [t.kind for t in v]
        if len(set(kinds)) < len(kinds):
            raise ValueError(f"each tracker at most once (got {kinds})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.prompts_per_step % self.optim.mini_batches:
            raise ValueError(
                f"prompts_per_step ({self.prompts_per_step}) must be a multiple of optim.mini_batches "
                f"({self.optim.mini_batches}) so that groups are never split across optimizer steps"
            )
        if self.async_.mode == "one_step_off" and self.async_.max_staleness < 1:
            raise ValueError(
                "async.max_staleness must be >= 1 with async.mode 'one_step_off' (samples lag one version)"
            )
        if self.resources.weight_sync == "broadcast" and self.resources.rollout_engine == "hf":
            raise ValueError(
                "resources.weight_sync 'broadcast' needs resources.rollout_engine 'vllm' (the transformers "
                "engine has no weight-transfer API); use weight_sync 'object_store'"
            )
        if self.model.lora is not None and self.resources.weight_sync == "broadcast":
            raise ValueError(
                "model.lora: adapters travel through the object store (a few MB); set resources.weight_sync "
                "'object_store'"
            )
        if self.model.source == "random" and not self.model.config_overrides:
            raise ValueError("model.config_overrides is required when model.source is 'random'")
        if self.steps == 0 and self.eval is None:
            raise ValueError("steps: 0 evaluates only; add an `eval` section (or set steps >= 1)")
        if self.eval is not None:
            task_params = self.task.params
            if self.eval.dataset is None and not (
                isinstance(task_params, DatasetParams) and task_params.holdout
            ):
                raise ValueError(
                    "eval.dataset: name the evaluation rows, or train on a `dataset` task with "
                    "task.params.holdout > 0 (its held-out rows are evaluated)"
                )
            if (self.eval.max_new_tokens or 0) > self.sampling.max_new_tokens:
                raise ValueError(
                    f"eval.max_new_tokens ({self.eval.max_new_tokens}) exceeds sampling.max_new_tokens "
                    f"({self.sampling.max_new_tokens}), the rollout engines' length budget"
                )
        if self.env is not None:
            self._check_env(self.env)
        if self.sampling.overlong.mode != "none" and (self.ibpo is not None or self.env is not None):
            raise ValueError(
                "sampling.overlong.mode: not supported with `ibpo` or `env` (their advantages and lengths are "
                "built apart); set it to 'none' or remove the section"
            )
        if self.ibpo is not None and (self.ibpo.max_new_tokens or 0) > self.sampling.max_new_tokens:
            raise ValueError(
                f"ibpo.max_new_tokens ({self.ibpo.max_new_tokens}) exceeds sampling.max_new_tokens "
                f"({self.sampling.max_new_tokens}), the rollout engines' length budget"
            )
        return self

    def _check_env(self, env: EnvSpec) -> None:
        """The engines' prompt limit on every turn. `ibpo` combines with it: every option works on trajectories
        (docs/ibpo.md, "Multi-turn")."""
        if env.bounds.max_total_tokens > self.sampling.max_prompt_tokens:
            raise ValueError(
                f"env.bounds.max_total_tokens ({env.bounds.max_total_tokens}) exceeds sampling.max_prompt_tokens "
                f"({self.sampling.max_prompt_tokens}): each turn's prompt is the whole history, so lower the "
                "first or raise the second"
            )

    def privileges(self) -> dict[str, str]:
        """{field path: privilege} for every part of this spec that only an operator or admin may allow
        (custom code, host paths, an unconfined sandbox); see tgc_rl.tasks.grants.PRIVILEGES."""
        from tgc_rl.tasks.grants import CUSTOM_CODE, HOST_PATHS, privileged_fields

        out: dict[str, str] = {}
        if is_entry_point(self.task.name):
            out["task.name"] = CUSTOM_CODE
        if self.task.reward != "builtin":
            out["task.reward"] = CUSTOM_CODE
        if self.model.source not in BUILTIN_MODEL_SOURCES:
            out["model.source"] = HOST_PATHS
        if self.model.tokenizer is not None:
            out["model.tokenizer"] = HOST_PATHS
        if isinstance(self.task.params, TaskParams):
            out.update(privileged_fields(self.task.params))
        if self.env is not None:
            out.update(self.env.privileges())
        if self.eval is not None and self.eval.dataset is not None:
            out.update(
                {
                    f"eval.dataset.{k.rsplit('.', 1)[1]}": v
                    for k, v in privileged_fields(self.eval.dataset).items()
                }
            )
        return out

    def objective_overrides(self) -> dict[str, Any]:
        """The objective's knob overrides as the job runs them (the async default correction added)."""
        return async_objective_overrides(self.objective.name, self.objective.overrides, self.async_.depth)

    def objective_config(self) -> ObjectiveConfig:
        """The objective as the job runs it: rlcore's resolved, frozen config of objective_overrides(). The
        trainer and each learner rank build their Objective from this object; none resolves overrides again."""
        return resolve(self.objective.name, self.objective_overrides())

    def actor_threads(self, role: Literal["learner", "rollout"]) -> int:
        """torch threads of one learner rank / rollout replica (`resources.threads_per_actor`)."""
        return self.resources.threads(role, asynchronous=self.async_.depth > 0)

    # -- I/O --------------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path, **changes: Any) -> JobSpec:
        """The spec in the YAML file `path`, with top-level `changes` (e.g. steps=0) applied before it is parsed."""
        text = Path(path).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise SpecError(f"{path}: the top level of a job spec must be a mapping")
        return cls.parse({**data, **changes}, source=str(path))

    @classmethod
    def parse(cls, data: dict[str, Any], source: str = "spec") -> JobSpec:
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise SpecError(format_validation_error(e, source)) from None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


class SpecError(ValueError):
    """An invalid job spec; the message names each bad field and what to do."""


def format_validation_error(e: ValidationError, source: str = "spec") -> str:
    lines = [f"{source}: invalid job spec"]
    for err in e.errors():
        loc = field_path(err["loc"]) or "(top level)"
        msg = error_message(err)
        if err["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling (see `tgc schema`)"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def error_message(err: Any) -> str:
    """A pydantic error's message without pydantic's "Value error, " prefix (our validators say what is wrong)."""
    msg = str(err.get("msg", "invalid value"))
    return msg.removeprefix("Value error, ")
