"""The job spec is parsed once (issue 29, item 1): what the actors get are typed, resolved objects.

Each test parses a spec, then makes the parsers raise, then runs the part that consumes the spec in-process:
it must work from the typed objects it was handed.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re

import pytest

import rlcore
from tests.learner.conftest import TINY_MODEL, build_spec
from tgc_rl.config import CUSTOM_KIND, GYM_KIND, TASK_MODELS, JobSpec, SpecError, TaskSpec, task_kind
from tgc_rl.learner import LearnerSpec
from tgc_rl.tasks.arithmetic import ArithmeticParams
from tgc_rl.tasks.code import CodeParams
from tgc_rl.tasks.dataset import DatasetParams
from tgc_rl.tasks.gym import ReasoningGymParams
from tgc_rl.tasks.humaneval import HumanEvalParams
from tgc_rl.tasks.registry import BUILTIN_TASKS


def _no_resolving(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError("the objective's overrides were resolved again after the spec was parsed")

    for module in (
        "rlcore",
        "rlcore.presets",
        "rlcore.objective",
        "tgc_rl.config.sections",
        "tgc_rl.config.job",
    ):
        monkeypatch.setattr(f"{module}.resolve", refuse)


def test_a_learner_rank_gets_the_resolved_frozen_objective_with_the_async_default():
    job = JobSpec.parse(
        {"objective": {"name": "cp_grpo", "overrides": {"kl_coef": 0.05}}, "async": {"mode": "one_step_off"}}
    )
    spec = LearnerSpec.of(job)
    assert isinstance(spec.objective_config, rlcore.ObjectiveConfig)
    assert spec.objective_config == rlcore.resolve("cp_grpo", job.objective_overrides())
    assert spec.objective_config.kl_coef == 0.05 and spec.objective_config.behaviour_correction == "token_tis"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.objective_config.kl_coef = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "overrides", "reference", "entropies", "stages"),
    [
        ("cp_grpo", {}, False, False, 1),
        ("cp_grpo", {"kl_coef": 0.1}, True, False, 1),
        ("grpo", {"entropy_coef": 0.01}, False, True, 1),
        ("grpo", {"entropy_coef": -0.01}, False, True, 1),
        ("cp_grpo_lopti", {}, False, False, 2),
        ("cp_grpo_lopti", {"lopti_eta": -0.5}, False, False, 2),
    ],
)
def test_the_objective_says_what_it_needs(name, overrides, reference, entropies, stages):
    objective = rlcore.get_objective(name, **overrides)
    assert (objective.needs_reference, objective.needs_entropies, objective.stage_count) == (
        reference,
        entropies,
        stages,
    )


def test_the_learner_builds_what_the_objective_needs_from_the_resolved_config(monkeypatch, tmp_path):
    from tgc_rl.config import ModelSpec
    from tgc_rl.learner import Learner
    from tgc_rl.models import model_dir

    model = model_dir(ModelSpec(**TINY_MODEL), seed=0)
    spec = LearnerSpec.of(
        build_spec(**{"objective.name": "cp_grpo_lopti", "objective.overrides": {"kl_coef": 0.1}})
    )
    _no_resolving(monkeypatch)
    learner = Learner(spec, model)
    assert learner.objective.config is spec.objective_config
    assert learner.uses_reference and learner.reference is not None
    assert learner.stages_per_batch == 2


# -- the task section: one model per task kind, its params typed -------------------------------------------------


def _no_task_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError("task.params were parsed again after the spec was parsed")

    for target in (
        "tgc_rl.tasks.registry.parse_params",
        "tgc_rl.tasks.registry.validate_params",
        "tgc_rl.tasks.params.validate_params",
        "tgc_rl.config.task.validate_params",
    ):
        monkeypatch.setattr(target, refuse)


@pytest.mark.parametrize(
    ("task", "model", "params"),
    [
        ({}, "arithmetic", ArithmeticParams),
        ({"name": "arithmetic", "params": {"ops": ["*"]}}, "arithmetic", ArithmeticParams),
        ({"name": "code", "params": {"cases": 2}}, "code", CodeParams),
        ({"name": "humaneval"}, "humaneval", HumanEvalParams),
        ({"name": "dataset", "params": {"dataset_id": "ds_" + "0" * 32}}, "dataset", DatasetParams),
        ({"name": "reasoning_gym:chain_sum", "params": {"size": 5}}, GYM_KIND, ReasoningGymParams),
        ({"name": "pkg.tasks:make", "params": {"level": 3}}, CUSTOM_KIND, dict),
    ],
)
def test_the_task_name_selects_its_model_and_params_are_typed(task, model, params):
    for parsed in (
        JobSpec.parse({"task": task}).task,
        TaskSpec(**task),
        TaskSpec.model_validate(task),
    ):
        assert type(parsed) is TASK_MODELS[model] and isinstance(parsed, TaskSpec)
        assert type(parsed.params) is params
        # pickled by reference: Ray's arguments, the reward workers' frames
        assert pickle.loads(pickle.dumps(parsed)) == parsed
    assert set(TASK_MODELS) == {*BUILTIN_TASKS, GYM_KIND, CUSTOM_KIND}


def test_the_spec_as_written_is_kept_and_errors_name_task_params():
    spec = JobSpec.parse({"task": {"name": "arithmetic", "params": {"max_operand": 5}}})
    assert spec.to_dict()["task"]["params"] == {"max_operand": 5}  # not every default: stored specs unchanged
    assert JobSpec.parse(spec.to_dict()) == spec
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"task": {"name": "code", "params": {"cases": 0}}})
    assert "\n  task.params: task.params.cases:" in str(e.value) and "task.code" not in str(e.value)
    with pytest.raises(SpecError, match=r"task.params: task.params: give exactly one of path"):
        JobSpec.parse({"task": {"name": "dataset"}})
    with pytest.raises(SpecError, match=r"task.params: task.name: no reasoning-gym dataset 'nope'"):
        JobSpec.parse({"task": {"name": "reasoning_gym:nope"}})


def test_tgc_schema_shows_each_tasks_params_inline(capsys):
    from tgc_rl.cli import main

    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    kinds = [d["$ref"].rsplit("/", 1)[1] for d in schema["properties"]["task"]["oneOf"]]
    assert len(kinds) == len(TASK_MODELS)
    params = {
        schema["$defs"][k]["properties"]["name"].get("const"): schema["$defs"][k]["properties"]["params"]
        for k in kinds
    }
    for name, entry in BUILTIN_TASKS.items():
        assert params[name]["$ref"] == f"#/$defs/{entry.params.__name__}"
        assert set(schema["$defs"][entry.params.__name__]["properties"]) == set(entry.params.model_fields)
    # oneOf: each name fits exactly one branch of the published schema (as the discriminator picks it)
    patterns = {k: schema["$defs"][k]["properties"]["name"].get("pattern") for k in kinds}
    consts = {k: schema["$defs"][k]["properties"]["name"].get("const") for k in kinds}
    for name in [*BUILTIN_TASKS, "reasoning_gym:chain_sum", "pkg.tasks:make"]:
        fits = [k for k in kinds if consts[k] == name or (patterns[k] and re.search(patterns[k], name))]
        assert fits == [TASK_MODELS[task_kind(name)].__name__], name


def test_the_prompt_source_and_a_reward_worker_use_the_typed_params(monkeypatch):
    from tgc_rl.models import load_tokenizer
    from tgc_rl.reward import wire
    from tgc_rl.reward.pool import worker_init
    from tgc_rl.reward.worker import _verifier
    from tgc_rl.trainer.data import PromptSource

    spec = JobSpec.parse({"task": {"name": "arithmetic", "params": {"max_operand": 3, "ops": ["*"]}}})
    tokenizer = load_tokenizer(spec.model)
    _no_task_parsing(monkeypatch)
    prompts = PromptSource(spec, tokenizer).take(4)
    assert all(" * " in p.item.prompt for p in prompts), [p.item.prompt for p in prompts]
    # the worker's init frame as it travels (a pickle), built into the worker's task in this process
    [(kind, init)] = wire.FrameBuffer().feed(wire.encode("init", worker_init(spec.task, 7, frozenset())))
    assert kind == "init" and init["params"] == spec.task.params
    task = _verifier(init).task
    assert (task.ops, task.max_operand, task.seed) == (("*",), 3, 7)


def test_evaluation_and_the_policy_read_a_dataset_tasks_typed_params(monkeypatch, tmp_path):
    from tgc_rl.control.policy import dataset_references
    from tgc_rl.trainer.evaluation import eval_task

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"prompt": "{i}+1?", "answer": "{i + 1}"}}\n' for i in range(6)))
    spec = JobSpec.parse(
        {"task": {"name": "dataset", "params": {"path": str(rows), "holdout": 2}}, "eval": {}}
    )
    _no_task_parsing(monkeypatch)
    assert eval_task(spec).epoch_size() == 2
    assert dataset_references(spec) == {"task.params": spec.task.params}
