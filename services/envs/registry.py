"""`load_env`: an environment for one trajectory, from its spec name and params. The one place that knows
every built-in environment.

Built-ins are named like tasks: `calculator`, `feedback`, `python_tool`, and `openenv` (an OpenEnv class
named in its params, custom code too). Any other `module:Class` is a
custom environment (a class or factory called as `Class(ctx, params)`), which runs the spec's code and so
needs the operator's `custom_code` grant, exactly as a custom task does (services.tasks.params).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.envs.base import EnvContext, Environment
from services.envs.bounds import EnvBounds
from services.envs.calculator import CalculatorEnv, CalculatorParams
from services.envs.feedback import FeedbackEnv, FeedbackParams
from services.envs.openenv import OpenEnvAdapter, OpenEnvParams
from services.envs.python_tool import PythonToolEnv, PythonToolParams
from services.tasks.grants import CUSTOM_CODE, LOCAL_GRANTS, privileged_fields, require_grants
from services.tasks.registry import import_entry_point

BUILTIN_PARAMS: dict[str, type[BaseModel]] = {
    "calculator": CalculatorParams,
    "feedback": FeedbackParams,
    "openenv": OpenEnvParams,
    "python_tool": PythonToolParams,
}
_CUSTOM = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def check_env_name(name: str) -> str:
    if name in BUILTIN_PARAMS or _CUSTOM.match(name):
        return name
    raise ValueError(
        f"environment name {name!r}: use one of {', '.join(sorted(BUILTIN_PARAMS))} or 'module:Class'"
    )


def parse_env_params(name: str, params: dict[str, Any] | None) -> BaseModel | None:
    """A built-in's params checked against its schema (pydantic names the field); None for custom ones,
    whose params the class checks itself."""
    model = BUILTIN_PARAMS.get(check_env_name(name))
    return model.model_validate(params or {}) if model else None


class EnvSpec(BaseModel):
    """The environment section of a multi-turn job spec (not in JobSpec yet: see docs/multi_turn.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(..., min_length=1, max_length=200, description="A built-in or 'module:Class'.")
    params: dict[str, Any] = Field(default_factory=dict, description="The environment's own parameters.")
    bounds: EnvBounds = Field(default_factory=EnvBounds)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_env_name(v)

    @model_validator(mode="after")
    def _params(self) -> EnvSpec:
        parse_env_params(self.name, self.params)
        return self


def load_env(
    name: str, ctx: EnvContext, params: dict[str, Any] | None = None, grants: frozenset[str] = LOCAL_GRANTS
) -> Environment:
    """Build the environment `name` for the trajectory of `ctx`. Refuses a custom class without the
    `custom_code` grant and an unconfined sandbox without `unsafe_sandbox`, naming the field."""
    parsed = parse_env_params(name, params)
    # the fields a built-in marks privileged (e.g. python_tool's `sandbox: unsafe_local`), as for tasks
    require_grants(
        {f"env.params.{k.rsplit('.', 1)[1]}": v for k, v in privileged_fields(parsed).items()}, grants
    )
    if isinstance(parsed, OpenEnvParams):
        require_grants({"env.params.env": CUSTOM_CODE}, grants)  # it imports and runs the named class
        return OpenEnvAdapter(ctx, parsed)
    if isinstance(parsed, CalculatorParams):
        return CalculatorEnv(ctx, parsed)
    if isinstance(parsed, FeedbackParams):
        return FeedbackEnv(ctx, parsed)
    if isinstance(parsed, PythonToolParams):
        return PythonToolEnv(ctx, parsed)
    require_grants({"env.name": CUSTOM_CODE}, grants)
    factory = import_entry_point(name, "env.name")
    env: Environment = factory(ctx, dict(params or {}))
    return env
