"""`load_env`: an environment for one trajectory, from its spec name and params. The one place that knows
every built-in environment.

Built-ins are named like tasks: `calculator`, `feedback`, `python_tool`, and `openenv` (an OpenEnv class
named in its params, custom code too). Any other `module:Class` is a
custom environment (a class or factory called as `Class(ctx, params)`), which runs the spec's code and so
needs the operator's `custom_code` grant, exactly as a custom task does (tgc_rl.tasks.params).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tgc_rl.envs.base import EnvContext, Environment
from tgc_rl.envs.bounds import EnvBounds
from tgc_rl.envs.calculator import CalculatorEnv, CalculatorParams
from tgc_rl.envs.feedback import FeedbackEnv, FeedbackParams
from tgc_rl.envs.openenv import OpenEnvAdapter, OpenEnvParams
from tgc_rl.envs.python_tool import PythonToolEnv, PythonToolParams
from tgc_rl.tasks.grants import CUSTOM_CODE, LOCAL_GRANTS, privileged_fields, require_grants
from tgc_rl.tasks.params import validate_params
from tgc_rl.tasks.registry import import_entry_point

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
    """A built-in's params checked against its schema (ValueError whose lines start with
    `env.params.<field>`); None for custom ones, whose params the class checks itself."""
    model = BUILTIN_PARAMS.get(check_env_name(name))
    return validate_params(model, params or {}, "env.params") if model else None


class EnvSpec(BaseModel):
    """The environment section of a multi-turn job spec (`env:` in tgc_rl.config.JobSpec)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(..., min_length=1, max_length=200, description="A built-in or 'module:Class'.")
    params: dict[str, Any] = Field(
        default_factory=dict, validate_default=True, description="The environment's own parameters."
    )
    bounds: EnvBounds = Field(default_factory=EnvBounds)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_env_name(v)

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "name" in info.data:  # a bad name is reported on its own
            parse_env_params(info.data["name"], v)
        return v

    def privileges(self) -> dict[str, str]:
        """{field path: privilege} of what this section may only run with the operator's grant: the same
        fields `load_env` refuses without it (the control plane checks them at submission)."""
        parsed = parse_env_params(self.name, self.params)
        out = {f"env.params.{k.rsplit('.', 1)[1]}": v for k, v in privileged_fields(parsed).items()}
        if isinstance(parsed, OpenEnvParams):
            out["env.params.env"] = CUSTOM_CODE
        elif parsed is None:
            out["env.name"] = CUSTOM_CODE
        return out


def load_env(
    name: str, ctx: EnvContext, params: dict[str, Any] | None = None, grants: frozenset[str] = LOCAL_GRANTS
) -> Environment:
    """Build the environment `name` for the trajectory of `ctx`. Refuses a custom class without the
    `custom_code` grant and an unconfined sandbox without `unsafe_sandbox`, naming the field."""
    parsed = parse_env_params(name, params)
    # privileged params (python_tool's `sandbox: unsafe_local`), an OpenEnv class, a custom class
    require_grants(EnvSpec(name=name, params=dict(params or {})).privileges(), grants)
    if isinstance(parsed, OpenEnvParams):
        return OpenEnvAdapter(ctx, parsed)
    if isinstance(parsed, CalculatorParams):
        return CalculatorEnv(ctx, parsed)
    if isinstance(parsed, FeedbackParams):
        return FeedbackEnv(ctx, parsed)
    if isinstance(parsed, PythonToolParams):
        return PythonToolEnv(ctx, parsed)
    factory = import_entry_point(name, "env.name")
    env: Environment = factory(ctx, dict(params or {}))
    return env
