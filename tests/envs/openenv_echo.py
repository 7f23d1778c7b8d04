"""An environment in OpenEnv's shape (openenv-core's template echo environment, without the package):
pydantic Action/Observation with done, reward, metadata; reset() and step(action)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] = Field(default_factory=dict)


class Observation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    done: bool = False
    reward: bool | int | float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoEnvironment:
    def __init__(self, rounds: int = 2):
        self.rounds, self.steps = rounds, 0

    def reset(self) -> EchoObservation:
        return EchoObservation(echoed_message="Echo environment ready!")

    def step(self, action: EchoAction, timeout_s: float | None = None) -> EchoObservation:
        self.steps += 1
        self.last_timeout = timeout_s
        done = self.steps >= self.rounds
        return EchoObservation(
            echoed_message=action.message,
            message_length=len(action.message),
            done=done,
            reward=0.1 * len(action.message),
        )
