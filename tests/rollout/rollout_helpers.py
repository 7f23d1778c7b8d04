"""Helpers of the rollout tests: a tiny random-init Llama (head size 64, SmolLM2 tokenizer), specs, weights."""

from __future__ import annotations

import torch

TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
}
EOS = 2  # SmolLM2's <|im_end|>
PROMPTS = [[1, 540, 314, 3203, 28, 216, 33], [1, 9690, 198, 2683, 359], [1, 4093, 28, 7, 30, 11, 5, 2215, 17]]


def replica_spec(engine: str = "hf", dtype: str = "float32", **sampling):
    """The RolloutSpec one replica of `rollout_spec(...)`'s job gets (for driving an engine directly)."""
    from tgc_rl.rollout import RolloutSpec

    return RolloutSpec.of(rollout_spec(engine, dtype, **sampling))


def rollout_spec(engine: str = "hf", dtype: str = "float32", replicas: int = 1, **sampling):
    from tgc_rl.config import JobSpec

    return JobSpec.parse(
        {
            "name": "rt",
            "model": {"source": "random", "dtype": dtype, "config_overrides": TINY},
            "sampling": {"max_new_tokens": 12, "max_prompt_tokens": 32, **sampling},
            "resources": {
                "rollout_engine": engine,
                "vllm_memory_fraction": 0.01,
                "cpus_per_rollout": 1,
                "rollout_replicas": replicas,
                "threads_per_actor": 1,
            },
        }
    )


def perturbed(state: dict[str, torch.Tensor], seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    """A different, reproducible set of weights for the same model (what a learner step would publish)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g).to(v.dtype) for k, v in state.items()}


def eos_prone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights under which EOS has probability ~0.35 at every position.

    Embedding dimension 0 is a large constant, so after the final RMSNorm every hidden state has x0 ~ 11; the
    tied output embedding gives EOS 0.9 more in that dimension, a logit lead of ~10 over 49k equal tokens."""
    out = {k: v.clone() for k, v in state.items()}
    emb = out["model.embed_tokens.weight"]
    emb[:, 0] = 10.0
    emb[EOS, 0] = 10.9
    return out


def reference_logprobs(model, sequence: list[int], prompt_len: int, temperature: float = 1.0) -> list[float]:
    """transformers' log p(token | prefix) of the tokens after the prompt, at `temperature`."""
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits[0].float() / temperature
    logp = logits.log_softmax(-1)
    return [logp[t - 1, sequence[t]].item() for t in range(prompt_len, len(sequence))]


def reference_model(path, weights: dict[str, torch.Tensor] | None = None, dtype=torch.float32):
    """A transformers copy of the model at `path`, optionally with `weights` (HF names) loaded into it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if weights is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(weights[name])
    return model
