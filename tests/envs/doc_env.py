"""A custom environment written from docs/multi_turn.md alone (issue 30's "Done when"), loaded as
`tests.envs.doc_env:CountingEnv`; tests/trainer/test_custom_env_job.py runs it through `tgc train` and over
REST with the custom-code grant."""

import subprocess

from tgc_rl.envs import EnvContext, Message, StepInfo, StepResult


class CountingEnv:
    """Until its answer, each model turn goes to a tool that counts the turn's bytes (`wc -c`, in another process
    killed at the call's timeout); the turn numbered `answer_turn`, or one with `<done>`, is the answer, scored by
    the task's verifier."""

    def __init__(self, ctx: EnvContext, params: dict):
        turn = params.get("answer_turn", 2)
        if not isinstance(turn, int) or isinstance(turn, bool) or not 1 <= turn <= 8:
            raise ValueError(f"env.params.answer_turn: give an integer from 1 to 8 (got {turn!r})")
        self.ctx, self.answer_turn, self.turns = ctx, turn, 0

    def reset(self) -> list[Message]:
        return [Message("user", self.ctx.item.prompt)]

    def step(self, model_text: str) -> StepResult:
        self.turns += 1
        if "<done>" in model_text or self.turns >= self.answer_turn:
            score = self.ctx.verify(model_text)
            return StepResult(None, score.reward, done=True, info=StepInfo(detail=score.detail))
        timeout = self.ctx.start_tool_call()  # counts the call; raises BoundHit past max_tool_calls
        try:
            out = subprocess.run(
                ["wc", "-c"], input=model_text, capture_output=True, text=True, timeout=timeout, check=True
            )
        except subprocess.TimeoutExpired:  # subprocess.run killed the tool
            return StepResult((Message("tool", "the count timed out"),), info=StepInfo(tool_timeouts=1))
        except subprocess.CalledProcessError as e:
            return StepResult((Message("tool", f"error: {e.stderr.strip()}"),), info=StepInfo(tool_errors=1))
        return StepResult((Message("tool", f"{out.stdout.strip()} bytes"),))

    def close(self) -> None:
        pass  # nothing held between calls
