"""The job spec's `env:` section: checked by the environment's own params model, bounded like task.params,
a custom environment under the operator's custom-code grant, and a single-turn spec unchanged."""

import pytest

from tgc_rl.config import JobSpec, SpecError
from tgc_rl.control.policy import PolicyError, check_spec
from tgc_rl.control.settings import ControlSettings

CUSTOM = "tests.envs.custom_env:EchoTwice"
BOUNDS = {"max_total_tokens": 512, "max_observation_tokens": 64}


def multi_turn(**env) -> dict:
    return {"sampling": {"max_prompt_tokens": 512}, "env": {"bounds": BOUNDS, **env}}


@pytest.mark.parametrize(
    "env,message",
    [
        ({"name": "calculator", "params": {"max_digits": -1}}, "env.params.max_digits"),
        ({"name": "calculator", "params": {"digits": 3}}, "env.params.digits: unknown field"),
        ({"name": "openenv"}, "env.params.env"),
        ({"name": "calculator", "bounds": {"max_turns": 0}}, "env.bounds.max_turns"),
        ({"name": "calc"}, "env.name"),
    ],
)
def test_a_bad_field_is_refused_by_name(env, message):
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        JobSpec.parse({"sampling": {"max_prompt_tokens": 512}, "env": env})


def test_every_turn_must_fit_the_engines_prompt_limit():
    with pytest.raises(
        SpecError, match=r"env\.bounds\.max_total_tokens \(4096\) exceeds sampling\.max_prompt"
    ):
        JobSpec.parse({"env": {"name": "calculator"}})


def test_a_multi_turn_job_may_evaluate_and_run_ibpo_and_bad_eval_fields_are_named():
    spec = JobSpec.parse({**multi_turn(name="calculator"), "eval": {"dataset": {"hub_id": "o/n"}}})
    assert spec.env is not None and spec.eval is not None  # held-out trajectories: trainer/evaluation.py
    for mask in ("none", "naive", "symmetric"):  # every IBPO option runs on trajectories (docs/ibpo.md)
        spec = JobSpec.parse({**multi_turn(name="calculator"), "ibpo": {"mask": mask}})
        assert spec.env is not None and spec.ibpo is not None and spec.ibpo.mask == mask
    with pytest.raises(SpecError, match=r"eval\.dataset: name the evaluation rows"):
        JobSpec.parse(
            {**multi_turn(name="calculator"), "eval": {}}
        )  # an arithmetic task has no held-out rows
    with pytest.raises(SpecError, match=r"eval\.max_new_tokens \(512\) exceeds sampling\.max_new_tokens"):
        JobSpec.parse(
            {**multi_turn(name="calculator"), "eval": {"dataset": {"hub_id": "o/n"}, "max_new_tokens": 512}}
        )


def test_free_form_params_are_bounded_like_task_params():
    deep: dict = {"x": 1}
    for _ in range(9):
        deep = {"a": deep}
    with pytest.raises(SpecError, match=r"env\.params: nested deeper than"):
        JobSpec.parse(multi_turn(name=CUSTOM, params=deep))
    big = JobSpec.parse(multi_turn(name=CUSTOM, params={"word": "w" * 2000}))
    with pytest.raises(PolicyError) as e:
        check_spec(big, ControlSettings(max_free_form_bytes=1024), is_admin=True)
    assert [(v.field, "at most 1024" in v.msg) for v in e.value.violations] == [("env.params", True)]


def test_a_custom_environment_needs_the_custom_code_grant():
    spec = JobSpec.parse(multi_turn(name=CUSTOM, params={"word": "w"}))
    assert spec.privileges() == {"env.name": "custom_code"}
    with pytest.raises(PolicyError) as e:
        check_spec(spec, ControlSettings(), is_admin=False)
    assert [v.field for v in e.value.violations] == ["env.name"]
    check_spec(spec, ControlSettings(), is_admin=True)
    built_in = JobSpec.parse(multi_turn(name="calculator"))
    assert built_in.privileges() == {}
    check_spec(built_in, ControlSettings(), is_admin=False)
    unconfined = JobSpec.parse(multi_turn(name="python_tool", params={"sandbox": "unsafe_local"}))
    assert unconfined.privileges() == {"env.params.sandbox": "unsafe_sandbox"}


def test_a_single_turn_spec_has_no_env_and_the_schema_shows_the_section():
    assert JobSpec().env is None
    assert "env" in JobSpec.model_json_schema()["properties"]


def test_the_calculator_example_fits_its_bounds_with_room_to_answer(template):
    from tgc_rl.envs import EnvContext, load_env
    from tgc_rl.tasks import load_task

    spec = JobSpec.from_yaml("examples/multi_turn_calculator.yaml")
    assert spec.env is not None and len(spec.env.params["examples"]) == 2
    item = load_task(spec.task.name, spec.task.params, spec.seed).item(0)
    ctx = EnvContext(item, lambda text: None, spec.env.bounds)  # type: ignore[arg-type, return-value]
    first = load_env(spec.env.name, ctx, spec.env.params).reset()
    example = ["user", "assistant", "tool", "assistant"]  # question, call, result, answer
    assert [m.role for m in first] == ["system", *example, *example, "user"]
    room = spec.env.bounds.max_total_tokens - len(template.render(first, add_generation_prompt=True))
    # the question, a call, its result and the answer fit after the few-shot history
    assert room >= 2 * spec.sampling.max_new_tokens + spec.env.bounds.max_observation_tokens
