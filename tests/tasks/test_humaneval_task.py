import pytest

from tgc_rl.tasks import load_task
from tgc_rl.tasks.humaneval import HumanEvalTask


@pytest.fixture(scope="module")
def task():
    return HumanEvalTask(seed=0)


def test_all_164_problems_ship_in_the_wheel(task):
    assert len(task) == 164


def test_each_pass_over_the_data_is_a_seeded_permutation(task):
    first = {task.item(i).meta["task_id"] for i in range(164)}
    assert len(first) == 164
    assert [task.item(i).meta["task_id"] for i in range(5)] == [
        HumanEvalTask(seed=0).item(i).meta["task_id"] for i in range(5)
    ]
    assert [task.item(i).meta["task_id"] for i in range(10)] != [
        task.item(164 + i).meta["task_id"] for i in range(10)
    ]


def test_unshuffled_order_follows_the_dataset():
    task = HumanEvalTask(shuffle=False)
    assert [task.item(i).meta["task_id"] for i in range(3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


def test_the_prompt_carries_the_function_to_complete(task):
    item = task.item(0)
    assert item.kind == "code" and "```python" in item.prompt
    assert f"def {item.meta['tests']['entry_point']}(" in item.prompt


def test_canonical_solutions_pass(task):
    for i in range(0, 164, 12):  # a spread of problems; every one passes in the full check below
        item = task.item(i)
        score = task.score(item, f"```python\n{item.meta['reference']}```")
        assert (score.reward, score.status) == (1.0, "ok"), (item.meta["task_id"], score)


@pytest.mark.slow
def test_all_164_canonical_solutions_pass():
    from tgc_rl.config import TaskSpec
    from tgc_rl.reward import RewardPool

    task = HumanEvalTask(shuffle=False)
    items = [task.item(i) for i in range(164)]
    with RewardPool(TaskSpec(name="humaneval", params={"shuffle": False}, reward_workers=2)) as pool:
        scores = pool.score(items, [f"```python\n{it.meta['reference']}```" for it in items])
    failed = [(it.meta["task_id"], s) for it, s in zip(items, scores, strict=True) if s.reward != 1.0]
    assert not failed


def test_a_body_only_completion_is_accepted():
    task = HumanEvalTask(shuffle=False)
    item = task.item(2)  # truncate_number: return number % 1.0
    assert task.score(item, "    return number % 1.0\n").reward == 1.0


def test_a_wrong_solution_fails(task):
    item = task.item(0)
    entry = item.meta["tests"]["entry_point"]
    score = task.score(item, f"```python\ndef {entry}(*args, **kwargs):\n    return None\n```")
    assert (score.reward, score.status) == (0.0, "ok")


@pytest.mark.parametrize(
    "params,field",
    [
        ({"timeout_s": -1}, "timeout_s"),
        ({"sandbox": "none"}, "sandbox"),
        ({"instruction": "no slot"}, "instruction"),
        ({"typo": 1}, "typo"),
    ],
)
def test_bad_params_are_refused_naming_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        load_task("humaneval", params, 0)
