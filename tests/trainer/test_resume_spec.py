"""A resume trains what the checkpoint was trained on: a spec that changes it (objective, group_size, model,
seed, ...) is refused before anything starts, naming each changed field; how long, where and how the run
is watched (steps, name, resources, checkpoint, eval, traces) may change."""

import json

import pytest
import yaml

from tests.trainer.conftest import BASE
from tgc_rl.cli import main
from tgc_rl.config import JobSpec
from tgc_rl.run_layout import CHECKPOINTS_DIR, EVENTS_FILE, SPEC_FILE
from tgc_rl.trainer.checkpoints import Checkpoints
from tgc_rl.trainer.main import RESUME_MAY_CHANGE, ResumeMismatch, check_resume, run

ORIGINAL = JobSpec.parse(BASE)


def _trained(tmp_path, spec: JobSpec = ORIGINAL):
    """A run dir as a run of `spec` leaves it after step 2: its spec.yaml and a checkpoint that holds the spec."""
    run_dir = tmp_path / "run"
    ck = Checkpoints(run_dir / CHECKPOINTS_DIR, keep_last=2)
    path = ck.commit(ck.staging(2), 2, {"step": 2, "version": 2, "data_position": 4, "spec": spec.to_dict()})
    (run_dir / SPEC_FILE).write_text(spec.to_yaml())
    return run_dir, path


def _changed(**fields) -> JobSpec:
    return JobSpec.parse({**BASE, **fields})


def test_a_resume_that_changes_what_is_trained_is_refused_naming_the_fields(tmp_path):
    run_dir, _ = _trained(tmp_path)
    changed = _changed(group_size=8, objective={"name": "grpo"}, steps=5)
    with pytest.raises(ResumeMismatch) as e:
        run(changed, run_dir, resume="latest")
    msg = str(e.value)
    assert "group_size (4 -> 8)" in msg and "objective.name ('cp_grpo' -> 'grpo')" in msg
    assert "steps" not in msg.split("may change only")[0]  # steps may change: not named as a difference
    assert JobSpec.from_yaml(run_dir / SPEC_FILE) == ORIGINAL  # the run dir keeps the spec it ran
    events = [json.loads(ln) for ln in (run_dir / EVENTS_FILE).read_text().splitlines()]
    assert (
        events[-1]["type"] == "state"
        and events[-1]["state"] == "failed"
        and "group_size" in events[-1]["reason"]
    )


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"seed": 7}, "seed (0 -> 7)"),
        ({"model": {**BASE["model"], "dtype": "bfloat16"}}, "model.dtype ('float32' -> 'bfloat16')"),
        ({"task": {**BASE["task"], "name": "code"}}, "task.name ('arithmetic' -> 'code')"),
        (
            {"objective": {"name": "cp_grpo", "overrides": {"kl_coef": 0.1}}},
            "objective.overrides.kl_coef (None -> 0.1)",
        ),
        ({"prompts_per_step": 4}, "prompts_per_step (2 -> 4)"),
    ],
)
def test_each_field_that_decides_training_is_compared(tmp_path, fields, named):
    _, checkpoint = _trained(tmp_path)
    with pytest.raises(ResumeMismatch, match="changes what is trained") as e:
        check_resume(_changed(**fields), checkpoint)
    assert named in str(e.value)


def test_length_name_resources_checkpoints_eval_and_traces_may_change(tmp_path):
    _, checkpoint = _trained(tmp_path)
    longer = _changed(
        steps=10,
        name="tiny-longer",
        resources={**BASE.get("resources", {}), "cpus_per_rollout": 2},
        checkpoint={"every_steps": 1, "keep_last": 5},
        traces={"enabled": False},
    )
    check_resume(longer, checkpoint)  # no error


def test_tgc_train_resume_with_a_changed_spec_exits_2_naming_the_field(tmp_path, capsys):
    run_dir, _ = _trained(tmp_path)
    spec_file = tmp_path / "changed.yaml"
    spec_file.write_text(yaml.safe_dump({**BASE, "group_size": 6}))
    assert main(["train", str(spec_file), "--run-dir", str(run_dir), "--resume"]) == 2
    assert "group_size (4 -> 6)" in capsys.readouterr().err


def test_what_may_change_names_spec_fields_and_none_that_decides_training():
    fields = {f.alias or name for name, f in JobSpec.model_fields.items()}
    assert RESUME_MAY_CHANGE <= fields  # a misspelt name would let nothing through and guard nothing
    trained = {
        "model",
        "task",
        "objective",
        "sampling",
        "optim",
        "async",
        "ibpo",
        "group_size",
        "prompts_per_step",
        "seed",
        "dynamic_sampling",
    }
    assert trained <= fields and trained.isdisjoint(RESUME_MAY_CHANGE)
