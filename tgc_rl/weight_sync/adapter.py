"""A LoRA adapter as it travels and as it is stored: PEFT tensor names, PEFT's directory format.

The learner publishes only the adapter tensors (`AdapterWeights`, a FlatWeights with the adapter's shape
attached); a vLLM replica writes them as a PEFT directory and loads it as a new, versioned adapter. Checkpoints
write the same directory, so what the engine serves, what `peft.PeftModel.from_pretrained` loads and what a
checkpoint holds are one format (docs/lora.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from tgc_rl.weight_sync.flat import FlatWeights

PEFT_PREFIX = "base_model.model."  # PeftModel's prefix before the wrapped model's own names
WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
_LORA_PARTS = (".lora_A.", ".lora_B.")


def peft_name(name: str, adapter: str = "default") -> str:
    """The saved PEFT name of a LoRA parameter of the wrapped model: `model.layers.0.self_attn.q_proj.lora_A.
    default.weight` -> `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    for part in _LORA_PARTS:
        name = name.replace(f"{part}{adapter}.", part)
    return PEFT_PREFIX + name


def target_modules(names: list[str]) -> list[str]:
    """The short module names (q_proj, down_proj, ...) that the adapter tensors adapt."""
    out = set()
    for name in names:
        part = next((p for p in _LORA_PARTS if p in name), None)
        if part is None:
            raise ValueError(f"{name!r} is not a LoRA tensor name (no .lora_A. / .lora_B.)")
        out.add(name.split(part)[0].rsplit(".", 1)[-1])
    return sorted(out)


def write_peft_dir(
    out: Path,
    tensors: Mapping[str, torch.Tensor],
    rank: int,
    alpha: int,
    base_model: str,
    dropout: float = 0.0,
) -> Path:
    """Write `tensors` (PEFT names) as a PEFT adapter directory: adapter_config.json + adapter_model.safetensors."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules(list(tensors)),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )
    config.save_pretrained(str(out))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / WEIGHTS_FILE))
    return out


@dataclass
class AdapterWeights(FlatWeights):
    """Adapter tensors (PEFT names) in one flat buffer, with the rank and alpha an engine needs to serve them."""

    rank: int = 0
    alpha: int = 0

    @classmethod
    def pack(cls, state_dict: Mapping[str, torch.Tensor], rank: int, alpha: int) -> AdapterWeights:
        if not state_dict:
            raise ValueError("AdapterWeights.pack: no adapter tensors (is model.lora set for the learner?)")
        flat = FlatWeights.from_state_dict(state_dict)
        return cls(flat.buffer, flat.entries, rank=rank, alpha=alpha)

    def write(self, out: Path, base_model: str) -> Path:
        return write_peft_dir(out, self.to_state_dict(), self.rank, self.alpha, base_model)


def read_peft_dir(path: Path) -> AdapterWeights:
    """A PEFT adapter directory (what `write_peft_dir` and a LoRA checkpoint's `adapter/` hold) as the
    AdapterWeights a sync sends, so that an engine loads it exactly as it loads the learner's adapter."""
    from safetensors.torch import load_file

    config_file, weights_file = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not config_file.is_file() or not weights_file.is_file():
        raise ValueError(
            f"{path} is not a PEFT adapter directory (it needs {CONFIG_FILE} and {WEIGHTS_FILE})"
        )
    config = json.loads(config_file.read_text())
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or not isinstance(alpha, int) or rank < 1 or alpha < 1:
        raise ValueError(
            f"{config_file}: `r` and `lora_alpha` must be positive integers (got {rank!r}, {alpha!r})"
        )
    # AdapterWeights.write keeps only r and lora_alpha: an adapter scaled otherwise would be served wrongly
    if other := [k for k in ("use_rslora", "use_dora") if config.get(k)]:
        raise ValueError(f"{config_file}: {', '.join(other)} is not supported (plain LoRA only)")
    return AdapterWeights.pack(load_file(str(weights_file)), rank, alpha)


def merged_model_state(base: Path, adapter: Path) -> dict[str, torch.Tensor]:
    """The base model's full float32 state dict with the PEFT adapter folded in by `peft` itself
    (merge_and_unload), under the base model's own names: what an engine without adapters (transformers) loads
    as full weights, casting them to its own dtype."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(lm, str(adapter)).merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}
