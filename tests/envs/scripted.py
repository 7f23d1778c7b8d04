"""Scripted environments and a scripted engine for the trajectory tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tgc_rl.envs import EnvBounds, EnvContext, GenerateRequest, Message, Sample, StepResult, TrajectoryRun
from tgc_rl.envs.tokens import ChatTemplate, TrajectoryBuilder
from tgc_rl.tasks import Score, TaskItem


def context(
    bounds: EnvBounds | None = None, clock: Callable[[], float] | None = None, answer: str = "5"
) -> EnvContext:
    item = TaskItem(id="t-0", prompt="What is 2 + 3?", answer=answer)
    verify = lambda text: Score(float(text.strip().endswith(answer)), detail="checked")  # noqa: E731
    if clock is None:
        return EnvContext(item, verify, bounds or EnvBounds())
    return EnvContext(item, verify, bounds or EnvBounds(), clock=clock)


class ScriptedEnv:
    """Gives the observations of `script` in turn (a tuple of messages each), then done with `reward`."""

    def __init__(
        self, ctx: EnvContext, script: Sequence[tuple[Message, ...]], reward: float = 1.0, tools: int = 0
    ):
        self.ctx, self.script, self.reward, self.tools = ctx, list(script), reward, tools
        self.steps = 0
        self.closed = 0

    def reset(self) -> list[Message]:
        return [Message("user", self.ctx.item.prompt)]

    def step(self, model_text: str) -> StepResult:
        for _ in range(self.tools):
            self.ctx.start_tool_call()
        self.steps += 1
        if self.steps > len(self.script):
            return StepResult(None, self.reward, True)
        return StepResult(self.script[self.steps - 1])

    def close(self) -> None:
        self.closed += 1


def drive(
    run: TrajectoryRun, engine: Callable[[GenerateRequest], Sample]
) -> list[tuple[GenerateRequest, Sample]]:
    log = []
    while (request := run.request()) is not None:
        sample = engine(request)
        log.append((request, sample))
        run.feed(sample)
    return log


def run_of(env, ctx: EnvContext, template: ChatTemplate, max_new_tokens: int = 64) -> TrajectoryRun:
    return TrajectoryRun(env, ctx, TrajectoryBuilder(template), max_new_tokens=max_new_tokens)
