import pytest

from tgc_rl.tasks.arithmetic import ArithmeticTask


def test_items_are_deterministic_per_seed_and_index():
    a, b = ArithmeticTask(seed=5), ArithmeticTask(seed=5)
    assert [a.item(i) for i in range(10)] == [b.item(i) for i in range(10)]
    assert [a.item(i).prompt for i in range(10)] != [ArithmeticTask(seed=6).item(i).prompt for i in range(10)]


def test_answers_are_the_true_results():
    task = ArithmeticTask(seed=0, max_operand=20, ops=["+", "-", "*"])
    for i in range(50):
        item = task.item(i)
        a, op, b = item.prompt.removeprefix("What is ").split("?")[0].split()
        assert int(item.answer) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert item.kind == "math"


def test_operands_stay_in_range():
    task = ArithmeticTask(seed=0, min_operand=3, max_operand=4)
    operands = {int(x) for i in range(30) for x in task.item(i).prompt.split("?")[0].split()[2::2]}
    assert operands <= {3, 4}


def test_score_accepts_the_last_number_and_rejects_others():
    task = ArithmeticTask(seed=0)
    item = task.item(0)
    assert task.score(item, f"The answer is {item.answer}.").reward == 1.0
    assert task.score(item, f"{item.answer} no wait, {int(item.answer) + 1}").reward == 0.0
    assert task.score(item, "I don't know").reward == 0.0


@pytest.mark.parametrize(
    "kwargs,needle",
    [({"ops": ["/"]}, "ops"), ({"ops": []}, "ops"), ({"min_operand": 5, "max_operand": 2}, "min_operand")],
)
def test_bad_params_are_refused_naming_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ArithmeticTask(**kwargs)
