"""Job specs of the tests: a folder's base spec with dotted-key changes, e.g. {"optim.lr": 1e-3}."""

from __future__ import annotations

import copy
from typing import Any

from tgc_rl.config import JobSpec


def job_spec(base: dict[str, Any], **changes: Any) -> JobSpec:
    data = copy.deepcopy(base)  # changes must not leak into the base, or into later tests' specs
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return JobSpec.parse(data)
