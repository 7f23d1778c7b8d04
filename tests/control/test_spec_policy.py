import pytest

from tgc_rl.config import JobSpec, SpecError
from tgc_rl.control.policy import PolicyError, check_spec
from tgc_rl.control.settings import ControlSettings


def fields(spec: dict, settings: ControlSettings | None = None, admin: bool = False) -> set[str]:
    try:
        check_spec(JobSpec.parse(spec), settings or ControlSettings(), admin)
    except PolicyError as e:
        return {v.field for v in e.violations}
    return set()


def test_default_spec_passes():
    assert fields({}) == set()


def test_server_limits_are_reported_by_field():
    tight = ControlSettings(max_steps=10, max_replicas=2, max_new_tokens=16, max_samples_per_step=8)
    spec = {
        "steps": 11,
        "resources": {"rollout_replicas": 2},
        "sampling": {"max_new_tokens": 32},
        "group_size": 4,
        "prompts_per_step": 4,
    }
    assert fields(spec, tight) == {"steps", "resources", "sampling.max_new_tokens", "prompts_per_step"}


def test_oversized_free_form_mapping_is_refused():
    big = {f"k{i}": "x" * 100 for i in range(1000)}
    assert fields({"task": {"name": "mymod:make", "params": big}}, admin=True) == {"task.params"}


def test_deeply_nested_free_form_mapping_is_refused():
    deep: dict = {}
    node = deep
    for _ in range(12):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(SpecError, match=r"task.params: nested deeper than 8 levels"):
        JobSpec.parse({"task": {"name": "mymod:make", "params": deep}})


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"task": {"name": "os:system"}}, "task.name"),
        ({"task": {"reward": "mymod:score"}}, "task.reward"),
        ({"model": {"source": "/etc"}}, "model.source"),
    ],
)
def test_custom_code_and_local_paths_need_admin(spec, field):
    assert fields(spec) == {field}
    assert fields(spec, admin=True) == set()
    assert fields(spec, ControlSettings(allow_custom_code=True)) == set()


def test_reasoning_gym_tasks_are_builtin():
    assert fields({"task": {"name": "reasoning_gym:leg_counting"}}) == set()
