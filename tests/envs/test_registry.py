"""Environments by name: built-ins, custom `module:Class` under the custom-code grant, params by schema."""

import pytest
from pydantic import ValidationError

from tests.envs.scripted import context
from tgc_rl.envs import EnvSpec, load_env
from tgc_rl.envs.calculator import CalculatorEnv
from tgc_rl.envs.feedback import FeedbackEnv
from tgc_rl.envs.python_tool import PythonToolEnv
from tgc_rl.tasks import GrantError

CUSTOM = "tests.envs.custom_env:EchoTwice"


@pytest.mark.parametrize(
    "name,cls", [("calculator", CalculatorEnv), ("feedback", FeedbackEnv), ("python_tool", PythonToolEnv)]
)
def test_builtins_by_name(name, cls):
    assert isinstance(load_env(name, context(), grants=frozenset()), cls)


def test_a_custom_environment_needs_the_custom_code_grant():
    with pytest.raises(GrantError, match="custom_code"):
        load_env(CUSTOM, context(), grants=frozenset())
    env = load_env(CUSTOM, context(), {"word": "more"}, grants=frozenset({"custom_code"}))
    assert env.reset()[0].content == "What is 2 + 3?"
    assert env.step("4").observation[0].content == "more"


def test_an_unconfined_sandbox_needs_its_grant():
    with pytest.raises(GrantError, match="env.params.sandbox.*unsafe_sandbox"):
        load_env("python_tool", context(), {"sandbox": "unsafe_local"}, grants=frozenset({"custom_code"}))


@pytest.mark.parametrize(
    "spec,field",
    [
        ({"name": "nope"}, "name"),
        ({"name": "calculator", "params": {"max_exponent": 0}}, "max_exponent"),
        ({"name": "feedback", "params": {"tries": 99}}, "tries"),
        ({"name": "python_tool", "params": {"sandbox": "docker"}}, "sandbox"),
        ({"name": "python_tool", "params": {"unknown": 1}}, "unknown"),
        ({"name": "feedback", "bounds": {"max_turns": 0}}, "max_turns"),
        ({"name": "openenv"}, "env"),
        ({"name": "openenv", "params": {"env": "not a class"}}, "env"),
    ],
)
def test_the_spec_section_names_the_bad_field(spec, field):
    with pytest.raises(ValidationError, match=field):
        EnvSpec.model_validate(spec)


def test_a_custom_name_is_accepted_by_the_spec_and_its_params_left_to_it():
    spec = EnvSpec.model_validate({"name": CUSTOM, "params": {"word": "x"}, "bounds": {"max_turns": 2}})
    assert spec.bounds.max_turns == 2


OPENENV = {"env": "tests.envs.openenv_echo:EchoEnvironment", "env_kwargs": {"rounds": 2}}


def test_an_openenv_environment_runs_without_glue():
    ctx = context()
    env = load_env("openenv", ctx, OPENENV, grants=frozenset({"custom_code"}))
    (first,) = env.reset()
    assert first.content == "What is 2 + 3?\n\nEcho environment ready!"
    one = env.step("hello")
    assert one.observation[0].content == "hello" and not one.done and one.reward == pytest.approx(0.5)
    assert env.env.last_timeout == ctx.bounds.tool_timeout_s
    two = env.step("bye")
    assert two.done and two.observation is None and two.reward == pytest.approx(0.3)


def test_openenv_names_its_glue_fields():
    env = load_env("openenv", context(), {**OPENENV, "observation_field": "message_length"})
    env.reset()
    assert env.step("four").observation[0].content == "4"
    with pytest.raises(ValueError, match="action_field"):
        load_env("openenv", context(), {**OPENENV, "action_field": "nope"})


def test_openenv_classes_are_custom_code():
    with pytest.raises(GrantError, match="env.params.env.*custom_code"):
        load_env("openenv", context(), OPENENV, grants=frozenset())
