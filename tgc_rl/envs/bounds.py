"""The bounds of one multi-turn trajectory: typed, each bounded, refused with the field named.

Every bound ends a trajectory with a recorded reason when it is hit (tgc_rl.envs.rollout), except
`max_observation_tokens`, which truncates an observation with a marker (the model still answers it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EnvBounds(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    max_turns: int = Field(4, ge=1, le=64, description="Model turns per trajectory.")
    max_tool_calls: int = Field(8, ge=0, le=256, description="Tool calls per trajectory (0: no tools).")
    tool_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Wall-clock limit of one tool call; the call's process is killed then.",
    )
    deadline_s: float = Field(
        300.0, gt=0, le=3600, description="Wall-clock limit of one trajectory (generation and tools)."
    )
    max_observation_tokens: int = Field(
        512, ge=1, le=32768, description="Content tokens of one observation; more is cut with a marker."
    )
    max_total_tokens: int = Field(
        4096, ge=16, le=262144, description="Tokens of the whole trajectory (prompt, turns, observations)."
    )

    @model_validator(mode="after")
    def _fits(self) -> EnvBounds:
        if self.max_observation_tokens >= self.max_total_tokens:
            raise ValueError(
                f"max_observation_tokens={self.max_observation_tokens} must be below "
                f"max_total_tokens={self.max_total_tokens}"
            )
        if self.tool_timeout_s > self.deadline_s:
            raise ValueError(
                f"tool_timeout_s={self.tool_timeout_s} must not exceed deadline_s={self.deadline_s}"
            )
        return self
