"""Job specs of the tests: a folder's base spec with dotted-key changes, e.g. {"optim.lr": 1e-3}."""

from __future__ import annotations

import copy
from typing import Any

from tgc_rl.config import JobSpec


def tiny_model(**config_overrides: Any) -> dict[str, Any]:
    """The tests' model: a random-init 2-layer Llama (head size 64) with SmolLM2's tokenizer, built in seconds."""
    overrides = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
    }
    return {"source": "random", "dtype": "float32", "config_overrides": {**overrides, **config_overrides}}


def job_spec(base: dict[str, Any], **changes: Any) -> JobSpec:
    data = copy.deepcopy(base)  # changes must not leak into the base, or into later tests' specs
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return JobSpec.parse(data)
