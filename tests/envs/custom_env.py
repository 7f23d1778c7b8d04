"""A custom environment, as a user would write one from docs/multi_turn.md (loaded as `module:Class`)."""

from tgc_rl.envs import EnvContext, Message, StepResult


class EchoTwice:
    def __init__(self, ctx: EnvContext, params: dict):
        self.ctx, self.word = ctx, params.get("word", "again")
        self.turns = 0

    def reset(self) -> list[Message]:
        return [Message("user", self.ctx.item.prompt)]

    def step(self, model_text: str) -> StepResult:
        self.turns += 1
        if self.turns == 2:
            return StepResult(None, self.ctx.verify(model_text).reward, True)
        return StepResult((Message("user", self.word),))

    def close(self) -> None:
        pass
