"""A custom environment whose tool never returns (CPU-bound), for the process-level deadline test."""

from tgc_rl.envs import EnvContext, Message, StepResult


class Spin:
    def __init__(self, ctx: EnvContext, params: dict):
        self.ctx = ctx

    def reset(self) -> list[Message]:
        return [Message("user", self.ctx.item.prompt)]

    def step(self, model_text: str) -> StepResult:
        self.ctx.start_tool_call()
        while True:  # CPU-bound: no asyncio timeout or signal-free wait could stop it
            pass

    def close(self) -> None:
        pass
