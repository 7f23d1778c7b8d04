"""The job spec: YAML round trip and field-level errors for bad input."""

import sys

import pytest

from tgc_rl.config import JobSpec, SpecError


def test_example_specs_load_and_round_trip(tmp_path):
    for name in ("examples/default.yaml", "examples/tiny.yaml", "examples/gsm_dataset.yaml"):
        spec = JobSpec.from_yaml(name)
        path = tmp_path / "again.yaml"
        path.write_text(spec.to_yaml())
        assert JobSpec.from_yaml(path) == spec


def test_unknown_objective_names_the_valid_choices():
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"objective": {"name": "grpoo"}})
    assert "objective.name" in str(e.value) and "cp_grpo" in str(e.value)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"bogus": 1}, "unknown knob(s) 'bogus'"),
        ({"kl_coef": -1}, "kl_coef': must be >= 0"),
        ({"gate": "sometimes"}, "not one of ppo, dual"),
    ],
)
def test_bad_objective_overrides_are_refused_at_parse_time(overrides, needle):
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"objective": {"name": "cp_grpo", "overrides": overrides}})
    assert "objective.overrides" in str(e.value) and needle in str(e.value)


def test_valid_objective_overrides_are_kept():
    spec = JobSpec.parse({"objective": {"name": "dapo", "overrides": {"clip_high": 0.3, "kl_coef": 0.01}}})
    assert spec.objective.overrides == {"clip_high": 0.3, "kl_coef": 0.01}


@pytest.mark.parametrize(
    "task,field,needle",
    [
        ({"name": "arithmetics"}, "task.name", "unknown task 'arithmetics'"),
        ({"name": "reasoning_gym:"}, "task.name", "name the reasoning-gym dataset"),
        ({"name": "my module:make"}, "task.name", "package.module:function"),
        ({"reward": "judge"}, "task.reward", "use 'builtin'"),
    ],
)
def test_bad_task_names_and_rewards_are_refused_at_parse_time(task, field, needle):
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"task": task})
    assert field in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize(
    "task",
    [
        {"name": "humaneval"},
        {"name": "reasoning_gym:chain_sum"},
        {"name": "pkg.tasks:make", "reward": "pkg.r:judge"},
    ],
)
def test_task_names_of_every_kind_are_accepted(task):
    assert JobSpec.parse({"task": task}).task.name == task["name"]


def test_group_size_below_two_is_refused():
    with pytest.raises(SpecError, match="group_size"):
        JobSpec.parse({"group_size": 1})


def test_unknown_field_is_named_with_a_fix():
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"optim": {"learning_rate": 1e-5}})
    assert "optim.learning_rate" in str(e.value) and "unknown field" in str(e.value)


def test_groups_must_divide_into_mini_batches():
    with pytest.raises(SpecError, match="never split"):
        JobSpec.parse({"prompts_per_step": 3, "optim": {"mini_batches": 2}})


def test_async_needs_staleness_of_at_least_one():
    with pytest.raises(SpecError, match="max_staleness"):
        JobSpec.parse({"async": {"mode": "one_step_off", "max_staleness": 0}})


def test_weight_broadcast_needs_the_vllm_engine():
    with pytest.raises(SpecError, match="weight_sync 'broadcast' needs resources.rollout_engine 'vllm'"):
        JobSpec.parse({"resources": {"weight_sync": "broadcast", "rollout_engine": "hf"}})
    assert (
        JobSpec.parse(
            {"resources": {"weight_sync": "broadcast", "rollout_engine": "vllm"}}
        ).resources.weight_sync
        == "broadcast"
    )


def test_random_model_needs_a_config():
    with pytest.raises(SpecError, match="config_overrides"):
        JobSpec.parse({"model": {"source": "random"}})


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="mapping"):
        JobSpec.from_yaml(path)


@pytest.mark.parametrize(
    "resources,mode,learner,rollout",
    [
        ({}, "sync", 2, 2),  # generation and learning take turns: each uses the job's 2 CPUs
        ({"learner_ranks": 2}, "sync", 1, 3),
        ({"cpus_per_learner": 0.5, "cpus_per_rollout": 0.5}, "sync", 1, 1),
        ({}, "one_step_off", 1, 1),  # both phases at once: each actor keeps its own CPUs
        ({"threads_per_actor": 3}, "one_step_off", 3, 3),
    ],
)
def test_actor_threads_follow_the_mode_and_the_reservation(resources, mode, learner, rollout):
    spec = JobSpec.parse({"resources": resources, "async": {"mode": mode}})
    assert (spec.actor_threads("learner"), spec.actor_threads("rollout")) == (learner, rollout)


def test_auto_dtype_is_stored_as_auto_and_resolved_by_each_actor_on_its_host(monkeypatch):
    import tgc_rl.config.model as config

    gpu_job = JobSpec.parse({"model": {"dtype": "auto"}, "resources": {"gpus_per_learner": 1}})
    assert gpu_job.model.dtype == "auto" and gpu_job.to_dict()["model"]["dtype"] == "auto"
    monkeypatch.setattr(config, "cpu_has_native_bf16", lambda: False)
    assert config.resolve_dtype("auto", on_gpu=False) == "float32"
    assert config.resolve_dtype("auto", on_gpu=True) == "bfloat16"
    monkeypatch.setattr(config, "cpu_has_native_bf16", lambda: True)
    assert config.resolve_dtype("auto", on_gpu=False) == "bfloat16"
    assert config.resolve_dtype("float32", on_gpu=True) == "float32"


def test_the_objective_is_checked_wherever_a_spec_is_parsed(monkeypatch):
    # rlcore is part of every install (torch-free); no import failure may skip the objective's check
    monkeypatch.setitem(sys.modules, "rlcore", None)
    with pytest.raises(SpecError, match="unknown objective 'nope'"):
        JobSpec.parse({"objective": {"name": "nope"}})
    with pytest.raises(SpecError, match="kl_coef"):
        JobSpec.parse({"objective": {"name": "cp_grpo", "overrides": {"kl_coef": -1}}})
