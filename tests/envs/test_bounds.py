"""Every bound of a trajectory: refused out of range with the field named, and enforced with a reason."""

import pytest
from pydantic import ValidationError

from tests.envs.scripted import ScriptedEnv, context, drive, run_of
from tgc_rl.envs import EnvBounds, Message, Sample, StepResult
from tgc_rl.envs.rollout import TRUNCATION_MARKER

IM_END = 2


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_turns", 0),
        ("max_turns", 65),
        ("max_tool_calls", -1),
        ("max_tool_calls", 257),
        ("tool_timeout_s", 0),
        ("tool_timeout_s", 301),
        ("deadline_s", 0),
        ("deadline_s", float("inf")),
        ("max_observation_tokens", 0),
        ("max_total_tokens", 15),
        ("max_total_tokens", 10**9),
    ],
)
def test_out_of_range_bounds_are_refused_by_name(field, value):
    with pytest.raises(ValidationError, match=field):
        EnvBounds(**{field: value})


def test_bounds_that_cannot_both_hold_are_refused_by_name():
    with pytest.raises(ValidationError, match="max_observation_tokens"):
        EnvBounds(max_observation_tokens=100, max_total_tokens=100)
    with pytest.raises(ValidationError, match="tool_timeout_s"):
        EnvBounds(tool_timeout_s=20, deadline_s=10)
    with pytest.raises(ValidationError, match="max_turn"):
        EnvBounds(max_turn=3)  # a misspelt field is named, not ignored


def _say(tokenizer, text="no", stop=True):
    ids = tuple(tokenizer.encode(text, add_special_tokens=False) + ([IM_END] if stop else []))
    return lambda request: Sample(
        ids[: request.max_tokens], tuple([-0.2] * len(ids[: request.max_tokens])), text
    )


def test_max_turns_ends_the_run(template, tokenizer):
    ctx = context(EnvBounds(max_turns=3))
    env = ScriptedEnv(ctx, [(Message("user", "again"),)] * 10)
    run = run_of(env, ctx, template)
    log = drive(run, _say(tokenizer))
    t = run.result()
    assert (t.end_reason, t.turns, len(log), env.closed) == ("max_turns", 3, 3, 1)


def test_max_tool_calls_stops_the_call_that_would_pass_it(template, tokenizer):
    ctx = context(EnvBounds(max_tool_calls=3, max_turns=10))
    env = ScriptedEnv(ctx, [(Message("tool", "ok"),)] * 10, tools=2)  # two calls per step
    run = run_of(env, ctx, template)
    drive(run, _say(tokenizer))
    t = run.result()
    assert (t.end_reason, t.tool_calls, t.turns) == ("max_tool_calls", 3, 2)


def test_the_deadline_ends_the_run(template, tokenizer):
    now = [0.0]
    ctx = context(EnvBounds(deadline_s=10, tool_timeout_s=5, max_turns=10), clock=lambda: now[0])
    env = ScriptedEnv(ctx, [(Message("user", "again"),)] * 10)
    run = run_of(env, ctx, template)
    say = _say(tokenizer)

    def slow(request):
        now[0] += 4.0  # each generation takes 4 s of the 10
        return say(request)

    drive(run, slow)
    t = run.result()
    assert (t.end_reason, t.turns) == ("deadline", 3)


def test_a_tool_call_gets_the_time_left_when_less_than_its_timeout(template):
    now = [0.0]
    ctx = context(EnvBounds(deadline_s=10, tool_timeout_s=8), clock=lambda: now[0])
    assert ctx.start_tool_call() == 8
    now[0] = 7.5
    assert ctx.start_tool_call() == 2.5


def test_max_total_tokens_caps_each_request_and_ends_the_run(template, tokenizer):
    ctx = context(EnvBounds(max_total_tokens=120, max_observation_tokens=16, max_turns=50))
    env = ScriptedEnv(ctx, [(Message("tool", "fine"),)] * 50)
    run = run_of(env, ctx, template, max_new_tokens=40)
    log = drive(run, _say(tokenizer, "word " * 30, stop=False))
    t = run.result()
    assert t.end_reason == "max_total_tokens"
    assert len(t.token_ids) <= 120
    assert all(r.max_tokens <= 120 - len(r.prompt_ids) for r, _ in log)


def test_a_long_observation_is_cut_to_its_bound_with_a_marker(template, tokenizer):
    ctx = context(EnvBounds(max_observation_tokens=20))
    env = ScriptedEnv(ctx, [(Message("tool", "spam " * 500),)])
    run = run_of(env, ctx, template)
    drive(run, _say(tokenizer))
    t = run.result()
    tool = next(m for m in t.messages if m.role == "tool")
    ids = template.encode("spam " * 500)
    assert tool.content == template.decode(ids[:20]) + TRUNCATION_MARKER.format(n=len(ids) - 20)
    assert t.observation_truncations == 1 and t.end_reason == "done"
    assert t.context_tokens < 60  # the tool's 500 tokens never reached the sequence


def test_an_environment_that_raises_ends_only_its_trajectory(template, tokenizer):
    ctx = context()

    class Broken(ScriptedEnv):
        def step(self, model_text):
            raise RuntimeError("boom")

    env = Broken(ctx, [])
    run = run_of(env, ctx, template)
    drive(run, _say(tokenizer))
    t = run.result()
    assert (t.end_reason, env.closed) == ("env_error", 1)
    assert "RuntimeError: boom" in t.detail


def test_a_step_result_checks_what_it_is_given():
    assert StepResult([Message("tool", "x")]).observation == (Message("tool", "x"),)  # a list becomes a tuple
    with pytest.raises(ValueError, match="needs a non-empty observation"):
        StepResult(None)
    with pytest.raises(ValueError, match="done step has no observation"):
        StepResult((Message("user", "x"),), done=True)
    with pytest.raises(ValueError, match="assistant"):
        StepResult((Message("assistant", "I said"),))
    with pytest.raises(ValueError, match="finite"):
        StepResult(None, float("nan"), done=True)
    with pytest.raises(ValueError, match="role"):
        Message("robot", "x")  # type: ignore[arg-type]


def test_a_first_observation_the_model_cannot_answer_ends_the_run(template):
    ctx = context()

    class EndsWithAssistant(ScriptedEnv):
        def reset(self):
            return [Message("user", "hi"), Message("assistant", "hello")]

    run = run_of(EndsWithAssistant(ctx, []), ctx, template)
    assert run.request() is None
    assert run.result().end_reason == "env_error" and "assistant" in run.result().detail
