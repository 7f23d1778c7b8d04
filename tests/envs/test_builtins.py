"""The built-in environments: calculator (a parser, never eval), feedback, python_tool (the sandbox)."""

import time

import pytest

from tests.envs.scripted import context, drive, run_of
from tgc_rl.envs import BoundHit, EnvBounds, Message, Sample
from tgc_rl.envs.calculator import CalcError, CalculatorEnv, CalculatorParams, evaluate
from tgc_rl.envs.feedback import FeedbackEnv, FeedbackParams
from tgc_rl.envs.python_tool import PythonToolEnv, PythonToolParams

IM_END = 2


def _run_turns(env, ctx, template, tokenizer, texts: list[str]):
    """Drive `env` with model turns of these texts (each closed by <|im_end|>); the finished trajectory."""
    turns = iter(texts)

    def engine(request):
        text = next(turns)
        ids = tuple(tokenizer.encode(text, add_special_tokens=False) + [IM_END])
        return Sample(ids, tuple([-0.1] * len(ids)), text)

    run = run_of(env, ctx, template)
    drive(run, engine)
    return run.result()


@pytest.mark.parametrize(
    "expression,value",
    [
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("-3^2", "-9"),
        ("2^3^2", "512"),
        ("2**10", "1024"),
        ("7/2", "3.5"),
        ("1/3", "0.333333333333"),
        ("0.1+0.2", "0.3"),
        ("123456789*987654321", "121932631112635269"),
        ("- - 4", "4"),
        ("2^-2", "0.25"),
    ],
)
def test_calculator_values(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression,why",
    [
        ("__import__('os').system('true')", "unexpected"),
        ("2 +", "ends too early"),
        ("1/0", "division by zero"),
        ("9^999999", "exponent"),
        ("99999999^64", "digits"),
        ("(" * 70 + "1" + ")" * 70, "nested"),
        ("1+" * 150 + "1", "longer than"),
        ("2^0.5", "whole exponents"),
        ("(1+2", "not closed"),
        ("", "empty"),
    ],
)
def test_calculator_refusals(expression, why):
    with pytest.raises(CalcError, match=why):
        evaluate(expression)


def test_calculator_bounds_are_fast():
    start = time.perf_counter()
    for e in ("9^64*9^64*9^64", "(" * 60 + "2^64" + ")" * 60, "1" * 199):
        try:
            evaluate(e)
        except CalcError:
            pass
    assert time.perf_counter() - start < 2


def test_calculator_environment_turns(template, tokenizer):
    ctx = context(EnvBounds(max_turns=3), answer="121932631112635269")
    env = CalculatorEnv(ctx, CalculatorParams())
    turns = ["Let me check. <calc>123456789*987654321</calc> <calc>1/0</calc>", "It is 121932631112635269"]
    t = _run_turns(env, ctx, template, tokenizer, turns)
    assert (t.end_reason, t.reward, t.turns, t.tool_calls, t.tool_errors) == ("done", 1.0, 2, 2, 1)
    tool = next(m for m in t.messages if m.role == "tool")
    assert tool.content == "123456789*987654321 = 121932631112635269\n1/0: error: division by zero"


def test_feedback_gives_one_more_try(template, tokenizer):
    ctx = context(EnvBounds(max_turns=4))
    env = FeedbackEnv(ctx, FeedbackParams(tries=2))
    first = env.reset()
    assert first == [Message("user", "What is 2 + 3?")]
    wrong = env.step("It is 6")
    assert not wrong.done and wrong.observation == (
        Message("user", "That is not correct. (checked) Try again."),
    )
    right = env.step("It is 5")
    assert right.done and right.reward == 1.0


def test_feedback_ends_after_its_tries(template):
    env = FeedbackEnv(context(), FeedbackParams(tries=2))
    env.reset()
    env.step("6")
    last = env.step("7")
    assert last.done and last.reward == 0.0


def test_feedback_template_is_checked():
    with pytest.raises(ValueError, match="feedback"):
        FeedbackParams(feedback="wrong {answer}")


# -- python_tool: the real sandbox ----------------------------------------------------------------------
def _tool(ctx, **params):
    env = PythonToolEnv(ctx, PythonToolParams(**params))
    env.reset()
    return env


def test_python_cells_behave_like_a_notebook():
    ctx = context(EnvBounds(tool_timeout_s=10))
    env = _tool(ctx)
    one = env.step("```python\nx = 40\nprint('set')\n```")
    assert one.observation == (Message("tool", "set\n"),)
    two = env.step("Now:\n```python\nprint(x + 2)\n```")
    assert two.observation == (Message("tool", "42\n"),)  # x survives; cell 1's output is not repeated
    three = env.step("```py\n1/0\n```")
    (message,) = three.observation
    assert "ZeroDivisionError" in message.content and "<cell 3>" in message.content
    assert three.info.tool_errors == 1
    final = env.step("The answer is 5")
    assert final.done and final.reward == 1.0 and ctx.tool_calls == 3


def test_python_output_is_cut_with_a_marker():
    env = _tool(context(), max_output_chars=100)
    (message,) = env.step("```python\nprint('y' * 5000)\n```").observation
    assert message.content == "y" * 100 + "\n...[truncated 4901 characters]"


def test_a_hanging_cell_is_killed_at_its_timeout():
    ctx = context(EnvBounds(tool_timeout_s=1.0))
    env = _tool(ctx)
    start = time.monotonic()
    result = env.step("```python\nwhile True:\n    pass\n```")
    assert time.monotonic() - start < 10  # killed at 1 s; the rest is sandbox start-up on a loaded machine
    (message,) = result.observation
    assert result.info.tool_timeouts == 1 and "killed" in message.content


def test_python_tool_calls_stop_at_the_bound():
    env = _tool(context(EnvBounds(max_tool_calls=1)))
    env.step("```python\nprint(1)\n```")
    with pytest.raises(BoundHit) as hit:
        env.step("```python\nprint(2)\n```")
    assert hit.value.reason == "max_tool_calls"


def test_calculator_worked_examples_are_real_chat_turns(template, tokenizer):
    example = {"question": "What is 12 * 34?", "expression": "12*34", "answer": "12 * 34 = 408."}
    env = CalculatorEnv(context(), CalculatorParams(examples=[example]))
    assert env.reset() == [
        Message("user", "What is 12 * 34?"),
        Message("assistant", "<calc>12*34</calc>"),
        Message("tool", "12*34 = 408"),
        Message("assistant", "12 * 34 = 408."),
        Message("user", "What is 2 + 3?"),
    ]


def test_a_worked_example_that_does_not_evaluate_is_refused_by_name():
    with pytest.raises(ValueError, match=r"examples\[0\].expression"):
        CalculatorParams(examples=[{"question": "q", "expression": "2^", "answer": "a"}])


def test_the_calculator_with_the_tool_off_plays_examples_without_it_and_runs_no_call(template, tokenizer):
    """`tool: false`, the baseline the tool is measured against: the examples are question and answer only,
    and a model turn is the final answer even if it writes a call (nothing is run, nothing counted)."""
    example = {"question": "What is 12 * 34?", "expression": "12*34", "answer": "408"}
    ctx = context(EnvBounds(max_turns=3), answer="5")
    env = CalculatorEnv(ctx, CalculatorParams(examples=[example], tool=False))
    assert env.reset() == [
        Message("user", "What is 12 * 34?"),
        Message("assistant", "408"),
        Message("user", "What is 2 + 3?"),
    ]
    text = "<calc>2+3</calc> 5"
    t = _run_turns(env, ctx, template, tokenizer, [text])
    assert (t.end_reason, t.reward, t.turns, t.tool_calls, t.tool_errors) == ("done", 1.0, 1, 0, 0)
    assert not any(m.role == "tool" for m in t.messages)
    # the same turn with the tool on is a call, and the run goes on to another turn
    on = CalculatorEnv(context(), CalculatorParams(examples=[example]))
    assert on.step(text).observation == (Message("tool", "2+3 = 5"),)


def test_the_calculator_with_the_tool_off_refuses_a_system_prompt_that_describes_it():
    with pytest.raises(ValueError, match=r"system_prompt describes the calculator .* tool is false"):
        CalculatorParams(tool=False, system_prompt="Write <calc>EXPRESSION</calc> to use the calculator.")
    assert CalculatorParams(tool=False, system_prompt="Answer with the number.").tool is False
