"""The `openenv` environment: an OpenEnv environment class (openenv-core's `Environment`) run in-process.

OpenEnv environments act on typed pydantic actions and return typed observations carrying `done`,
`reward` and `metadata`. The glue is the text boundary, and it is the only glue:
- the model's text becomes the action: the action class (the annotation of the env's `step`) is built with
  the text in its one required `str` field, or in `action_field`;
- an observation becomes one chat message (`role`): its `observation_field`, or its only `str` field, or
  else its fields as JSON (done, reward and metadata left out);
- `reward` (None counts 0) is summed over the steps and `done` ends the trajectory, as here.
The task item's prompt opens the first message, followed by the text of `reset()`'s observation.
This imports nothing of openenv-core (the class brings its own imports), so the job needs the package
only where the environment does. OpenEnv's servers (Docker, WebSocket) are not used: see docs/multi_turn.md.
"""

from __future__ import annotations

import inspect
import json
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tgc_rl.envs.base import EnvContext, Message, StepResult
from tgc_rl.tasks.registry import import_entry_point

_BASE_FIELDS = ("done", "reward", "metadata")


class OpenEnvParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    env: str = Field(
        ...,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="The OpenEnv Environment class, 'module:Class' (custom code: needs the operator's grant).",
    )
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the class.")
    action_field: str | None = Field(None, description="The action's str field the model's text fills.")
    observation_field: str | None = Field(None, description="The observation's field shown to the model.")
    role: Literal["user", "tool"] = Field("user", description="The role of observation messages.")


def _str_fields(model: type[BaseModel], required: bool) -> list[str]:
    return [
        name
        for name, info in model.model_fields.items()
        if name not in _BASE_FIELDS and info.annotation is str and (info.is_required() or not required)
    ]


class OpenEnvAdapter:
    def __init__(self, ctx: EnvContext, params: OpenEnvParams):
        self.ctx, self.params = ctx, params
        self.env = import_entry_point(params.env, "env.params.env")(**params.env_kwargs)
        try:
            hints = typing.get_type_hints(self.env.step)
        except Exception as e:  # an annotation that does not resolve
            raise ValueError(
                f"env.params.env {params.env!r}: cannot read its step() annotations ({e})"
            ) from None
        action = next((h for n, h in hints.items() if n not in ("return", "timeout_s")), None)
        if not (isinstance(action, type) and issubclass(action, BaseModel)):
            raise ValueError(f"env.params.env {params.env!r}: its step() does not annotate a pydantic action")
        self.action_class: type[BaseModel] = action
        fields = [params.action_field] if params.action_field else _str_fields(action, required=True)
        if len(fields) != 1 or fields[0] not in action.model_fields:
            raise ValueError(
                f"env.params.action_field: {action.__name__} needs one str field for the model's text "
                f"(its fields: {', '.join(action.model_fields)}); name it"
            )
        self.action_field = fields[0]
        self._step_timeout = "timeout_s" in inspect.signature(self.env.step).parameters

    def _text(self, observation: BaseModel) -> str:
        if self.params.observation_field:
            return str(getattr(observation, self.params.observation_field))
        fields = _str_fields(type(observation), required=False)
        if len(fields) == 1:
            return str(getattr(observation, fields[0]))
        return json.dumps(observation.model_dump(exclude=set(_BASE_FIELDS)), default=str)

    def reset(self) -> list[Message]:
        first = self._text(self.env.reset())
        prompt = self.ctx.item.prompt
        return [Message("user", f"{prompt}\n\n{first}" if prompt and first else prompt or first)]

    def step(self, model_text: str) -> StepResult:
        action = self.action_class.model_validate({self.action_field: model_text})
        kwargs = (
            {"timeout_s": min(self.ctx.bounds.tool_timeout_s, self.ctx.time_left())}
            if self._step_timeout
            else {}
        )
        observation = self.env.step(action, **kwargs)
        reward = float(observation.reward or 0.0)
        if observation.done:
            return StepResult(None, reward, True)
        return StepResult((Message(self.params.role, self._text(observation)),), reward)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
