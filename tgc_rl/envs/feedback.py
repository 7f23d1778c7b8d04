"""The `feedback` environment: several model turns and no tool. A wrong answer gets the verifier's verdict
and another try, up to `tries`; the trajectory's reward is the verifier's reward of the last answer."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tgc_rl.envs.base import EnvContext, Message, StepInfo, StepResult
from tgc_rl.tasks.params import check_template, fill_template


class FeedbackParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tries: int = Field(2, ge=1, le=16, description="Answers the model may give (1: single-turn).")
    feedback: str = Field(
        "That is not correct.{detail} Try again.",
        min_length=1,
        max_length=4096,
        description="The user message after a wrong answer; slot {detail}: the verifier's note, if any.",
    )

    @field_validator("feedback")
    @classmethod
    def _slots(cls, v: str) -> str:
        return check_template(v, ("detail",))


class FeedbackEnv:
    def __init__(self, ctx: EnvContext, params: FeedbackParams):
        self.ctx, self.params = ctx, params
        self.answers = 0

    def reset(self) -> list[Message]:
        return [Message("user", self.ctx.item.prompt)]

    def step(self, model_text: str) -> StepResult:
        self.answers += 1
        score = self.ctx.verify(model_text)
        if score.reward >= 1.0 or self.answers >= self.params.tries:
            return StepResult(None, score.reward, True, StepInfo(detail=score.detail))
        detail = f" ({score.detail})" if score.detail else ""
        text = fill_template(self.params.feedback, detail=detail)
        return StepResult((Message("user", text),), info=StepInfo(detail=score.detail))

    def close(self) -> None:
        pass
