"""LoRA on the learner's policy: PEFT adapters on a frozen base (`model.lora`, docs/lora.md).

`wrap` injects the adapters into the Hugging Face model in place and returns PEFT's wrapper; the learner keeps
training the inner model (`PolicyLogprobs` and FSDP2 see the same module tree as for full weights, with
`lora_A`/`lora_B` inside the adapted linears and every other parameter frozen). The KL reference is the same
model with the adapters switched off (`adapters_disabled`): no second copy of the weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

    from tgc_rl.config import LoraSpec

ADAPTER = "default"  # PEFT's adapter name: one adapter per policy
_BASE = ".base_layer."


def wrap(lm: PreTrainedModel, spec: LoraSpec) -> PeftModel:
    """Inject LoRA adapters (B = 0: the wrapped policy starts equal to the base) and freeze everything else.
    The caller goes on using `lm` itself (now holding the adapters); the wrapper is for disable/save."""
    from peft import LoraConfig, get_peft_model

    target = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=target,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        peft = get_peft_model(lm, config, adapter_name=ADAPTER)
    except ValueError as e:  # e.g. a target module the model does not have
        raise ValueError(f"model.lora.target_modules: {e}") from None
    if not any(p.requires_grad for p in lm.parameters()):
        raise ValueError(f"model.lora.target_modules {spec.target_modules!r} adapted no parameter")
    return peft


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


@contextmanager
def adapters_disabled(peft: PeftModel) -> Iterator[None]:
    """The base model's forward: the KL reference without a second copy of the weights."""
    with peft.disable_adapter():
        yield


def merged(state: Mapping[str, torch.Tensor], rank: int, alpha: int) -> dict[str, torch.Tensor]:
    """Full weights with the adapters folded in (W + alpha / rank * B @ A) under the base model's own names,
    from the wrapped model's full state dict (float32 master weights: merged before any cast)."""
    scale = alpha / rank
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if is_adapter(name):
            continue
        if _BASE not in name:
            out[name] = t
            continue
        module, param = name.split(_BASE)
        plain = f"{module}.{param}"
        a = state.get(f"{module}.lora_A.{ADAPTER}.weight")
        if param == "weight" and a is not None:
            b = state[f"{module}.lora_B.{ADAPTER}.weight"]
            out[plain] = t + scale * (b.to(torch.float32) @ a.to(torch.float32)).to(t.dtype)
        else:
            out[plain] = t
    return out
