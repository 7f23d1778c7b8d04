import pytest

from tgc_rl.tasks import load_task
from tgc_rl.tasks.arithmetic import ArithmeticTask
from tgc_rl.tasks.code import CodeTask
from tgc_rl.tasks.gym import ReasoningGymTask
from tgc_rl.tasks.humaneval import HumanEvalTask


@pytest.mark.parametrize(
    "name,params,cls",
    [
        ("arithmetic", {"max_operand": 5}, ArithmeticTask),
        ("code", {"cases": 2}, CodeTask),
        ("humaneval", {}, HumanEvalTask),
        ("reasoning_gym:chain_sum", {"size": 5}, ReasoningGymTask),
    ],
)
def test_names_dispatch_to_their_task(name, params, cls):
    task = load_task(name, params, seed=2)
    assert isinstance(task, cls) and task.seed == 2


def test_a_custom_module_function_builds_the_task():
    task = load_task("tgc_rl.tasks.arithmetic:ArithmeticTask", {"max_operand": 3}, seed=1)
    assert isinstance(task, ArithmeticTask) and task.max_operand == 3


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="humaneval"):
        load_task("mbpp")


def test_an_unimportable_custom_task_says_what_failed():
    with pytest.raises(ValueError, match="cannot import"):
        load_task("no_such_module_here:make")
