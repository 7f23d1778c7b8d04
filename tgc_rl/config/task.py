"""The `task` section: a discriminated union, one model per built-in task (typed params), reasoning-gym, custom
code; `field_path` names a validation error's location without the union's tag."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationInfo,
    create_model,
    field_serializer,
    field_validator,
)

from tgc_rl.config.base import _free_form, _Strict, check_free_form, is_entry_point
from tgc_rl.tasks.gym import ReasoningGymParams, check_gym_config
from tgc_rl.tasks.params import TaskParams, validate_params
from tgc_rl.tasks.registry import BUILTIN_TASKS, GYM_PREFIX, BuiltinTask, is_gym_name

DEFAULT_TASK = "arithmetic"
GYM_KIND = (
    f"{GYM_PREFIX}<dataset>"  # the tags of the two name patterns (never a built-in name: they hold a colon)
)
CUSTOM_KIND = "module:function"


class TaskSpec(_Strict):
    """Where prompts come from and how responses are scored: the base of one model per kind of task (TASK_MODELS:
    each built-in task with its typed params, `reasoning_gym:<dataset>`, custom `module:function`), chosen by
    `name`. `TaskSpec(...)` and `TaskSpec.model_validate(...)` build the model the name selects, so
    `spec.task.params` is that task's params object wherever the spec is read: nothing parses it again."""

    name: str = Field(
        DEFAULT_TASK,
        max_length=256,
        description=", ".join(
            f"`{t.name}`" + (f" ({t.about})" if t.about else "") for t in BUILTIN_TASKS.values()
        )
        + f", `{GYM_PREFIX}<dataset>`, or a custom task factory `module:function`.",
    )
    params: TaskParams | dict[str, Any] = Field(
        default_factory=dict,
        description="Task parameters, checked against the task's own schema (`tgc schema --task NAME` prints "
        "it), e.g. {max_operand: 9, ops: ['+']}; free-form only for custom `module:function` tasks.",
    )
    reward: str = Field(
        "builtin",
        max_length=256,
        description="`builtin` (the task's own verifier) or `module:function` taking (item, response) -> float.",
    )
    reward_timeout_s: float = Field(10.0, gt=0, le=600, description="Hard deadline per verification.")
    reward_workers: int = Field(2, ge=1, le=256, description="Worker processes of the reward pool.")

    def __new__(cls, *args: Any, **data: Any) -> TaskSpec:
        # TaskSpec(name=..., ...) is the model its name selects (a subclass: Python then runs its __init__)
        if cls is TaskSpec:
            cls = TASK_MODELS[task_kind(data.get("name", DEFAULT_TASK))]
        return super().__new__(cls)

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> TaskSpec:
        if cls is TaskSpec:
            return _TASK_ADAPTER.validate_python(obj, **kwargs)
        return super().model_validate(obj, **kwargs)

    @field_serializer("params")
    def _as_written(self, v: TaskParams | dict[str, Any]) -> dict[str, Any]:
        # the fields the spec set, as before params were typed: stored specs, spec.yaml and trackers unchanged
        return v.model_dump(mode="json", exclude_unset=True) if isinstance(v, TaskParams) else v

    @field_validator("reward")
    @classmethod
    def _reward_function(cls, v: str) -> str:
        if v == "builtin" or is_entry_point(v):
            return v
        raise ValueError(
            f"{v!r}: use 'builtin' (the task's own verifier) or a custom reward "
            "'package.module:function' taking (item, response)"
        )


def task_kind(name: object) -> str:
    """Which TASK_MODELS entry a task name selects: a built-in's own name, GYM_KIND or CUSTOM_KIND (a name that
    is neither goes to CUSTOM_KIND, whose check says what the known names are)."""
    if isinstance(name, str):
        if name in TASK_MODELS and name not in (GYM_KIND, CUSTOM_KIND):
            return name
        if name.startswith(GYM_PREFIX):
            return GYM_KIND
    return CUSTOM_KIND


def _unknown_task(name: str) -> ValueError:
    return ValueError(
        f"unknown task {name!r}; use one of {', '.join(BUILTIN_TASKS)}, "
        f"'{GYM_PREFIX}<dataset>' or a custom factory 'package.module:function'"
    )


def _typed_params(model: type[TaskParams]):
    """A `mode="before"` validator making a mapping `model` once, with messages naming `task.params.<field>`."""

    def check(cls, v: Any) -> Any:
        if isinstance(v, dict):
            check_free_form(v, "task.params")
            return validate_params(model, v)
        return v

    return field_validator("params", mode="before")(classmethod(check))


def _builtin_task_model(entry: BuiltinTask) -> type[TaskSpec]:
    # the default is validated too: a task whose params have required fields (dataset) says which
    params = Field(
        default_factory=dict, validate_default=True, description=f"The `{entry.name}` task's parameters."
    )
    return create_model(
        "".join(p.capitalize() for p in re.split(r"[\W_]+", entry.name)) + "TaskSpec",
        __base__=TaskSpec,
        __doc__=f"The built-in task `{entry.name}`.",
        __validators__={"_typed": _typed_params(entry.params)},
        name=(Literal[entry.name], Field(entry.name, description="The built-in task's name.")),  # type: ignore[valid-type, arg-type]
        params=(entry.params, params),
    )


class ReasoningGymTaskSpec(TaskSpec):
    """A reasoning-gym dataset, `reasoning_gym:<dataset>`; params: `size`, `instruction` and the dataset's own
    config fields (checked against its config class)."""

    # the patterns are the schema's only (the validators check the same, with messages that say what to write):
    # they keep the union's branches disjoint for a schema reader (oneOf)
    name: str = Field(
        description="`reasoning_gym:<dataset>`, e.g. `reasoning_gym:chain_sum`.",
        max_length=256,
        json_schema_extra={"pattern": r"^reasoning_gym:[\w.-]+$"},
    )
    params: ReasoningGymParams = Field(default_factory=dict, validate_default=True)  # type: ignore[arg-type]
    _typed = _typed_params(ReasoningGymParams)

    @field_validator("name")
    @classmethod
    def _dataset_named(cls, v: str) -> str:
        if is_gym_name(v):
            return v
        raise ValueError(
            f"{v!r}: name the reasoning-gym dataset after the colon, e.g. 'reasoning_gym:chain_sum'"
        )

    @field_validator("params")
    @classmethod
    def _dataset_config(cls, v: ReasoningGymParams, info: ValidationInfo) -> ReasoningGymParams:
        if "name" in info.data:  # a bad name is reported on its own
            check_gym_config(info.data["name"].removeprefix(GYM_PREFIX), v.dataset_config())
        return v


class CustomCodeTaskSpec(TaskSpec):
    """A custom task factory `module:function` (custom code: the operator's grant); its params are the
    factory's keyword arguments, free-form but bounded (check_free_form)."""

    name: str = Field(
        description="`package.module:function`, called as function(seed=..., **params).",
        max_length=256,
        json_schema_extra={"pattern": r"^(?!reasoning_gym:)[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"},
    )
    params: dict[str, Any] = Field(default_factory=dict, description="The factory's keyword arguments.")
    _free = field_validator("params", mode="before")(_free_form("task.params"))

    @field_validator("name")
    @classmethod
    def _entry_point(cls, v: str) -> str:
        if is_entry_point(v):
            return v
        raise _unknown_task(v)


TASK_MODELS: dict[str, type[TaskSpec]] = {
    **{entry.name: _builtin_task_model(entry) for entry in BUILTIN_TASKS.values()},
    GYM_KIND: ReasoningGymTaskSpec,
    CUSTOM_KIND: CustomCodeTaskSpec,
}
# The built-ins' models are made from the registry: named here too, so that pickle (Ray's arguments, the
# reward workers' frames) finds them by reference like any other class of this module.
globals().update({m.__name__: m for m in TASK_MODELS.values()})


def _kind_of(v: Any) -> str:
    return task_kind(v.get("name", DEFAULT_TASK) if isinstance(v, dict) else getattr(v, "name", DEFAULT_TASK))


if TYPE_CHECKING:
    AnyTask = TaskSpec
else:  # the task section as pydantic reads it: the model its name selects (and the schema lists each one)
    AnyTask = Annotated[
        Union[tuple(Annotated[m, Tag(k)] for k, m in TASK_MODELS.items())],  # noqa: UP007
        Discriminator(_kind_of),
    ]
_TASK_ADAPTER: TypeAdapter[TaskSpec] = TypeAdapter(AnyTask)


def field_path(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as the spec's dotted path, without the task union's tag (`task.params.x`,
    never `task.arithmetic.params.x`)."""
    parts = [str(p) for i, p in enumerate(loc) if not (i and loc[i - 1] == "task" and p in TASK_MODELS)]
    return ".".join(parts)
