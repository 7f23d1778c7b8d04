"""`load_task`: a task from its spec name and params. The one place that knows every built-in task; the
tasks themselves import only services.tasks.base and services.tasks.params."""

from __future__ import annotations

import importlib
from typing import Any

from services.tasks.base import GrantError, Task
from services.tasks.params import CUSTOM_CODE, LOCAL_GRANTS, parse_params, privileged_fields


def load_task(
    name: str, params: dict[str, Any] | None = None, seed: int = 0, grants: frozenset[str] = LOCAL_GRANTS
) -> Task:
    """Build a task from its spec name: a built-in, `reasoning_gym:<dataset>`, or `module:function`.

    `params` are checked against the task's declared schema (services.tasks.params), and every privileged
    field against `grants`: by default a worker refuses, e.g., an unconfined sandbox (`sandbox: unsafe_local`)
    unless the operator granted it to this job.
    """
    params = dict(params or {})
    parsed = parse_params(name, params)
    for path, privilege in privileged_fields(parsed).items():
        if privilege not in grants:
            raise GrantError(
                f"{path}: {params[path.rsplit('.', 1)[1]]!r} needs the operator's grant "
                f"'{privilege}', which this job does not have (see docs/security.md)"
            )
    if parsed is not None:
        params = parsed.model_dump(exclude_unset=True)
    if name == "arithmetic":
        from services.tasks.arithmetic import ArithmeticTask

        return ArithmeticTask(seed=seed, **params)
    if name == "humaneval":
        from services.tasks.humaneval import HumanEvalTask

        return HumanEvalTask(seed=seed, **params)
    if name == "dataset":
        from services.tasks.dataset import DatasetTask

        return DatasetTask(seed=seed, params=parsed)  # type: ignore[arg-type]
    if name == "code":
        from services.tasks.code import CodeTask

        return CodeTask(seed=seed, **params)
    if name.startswith("reasoning_gym:"):
        from services.tasks.gym import ReasoningGymTask

        return ReasoningGymTask(name.split(":", 1)[1], seed=seed, **params)
    if ":" in name:
        if CUSTOM_CODE not in grants:
            raise GrantError(f"task.name {name!r}: custom code needs the operator's grant '{CUSTOM_CODE}'")
        module, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"task.name {name!r}: cannot import {attr} from {module} ({e})") from None
        return factory(seed=seed, **params)
    raise ValueError(
        f"unknown task.name {name!r}; use 'arithmetic', 'code', 'humaneval', 'dataset', 'reasoning_gym:<dataset>' "
        "or 'module:function'"
    )
