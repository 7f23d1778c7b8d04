import pytest

from tgc_rl.tasks import load_task
from tgc_rl.tasks.code import FAMILIES, CodeTask


@pytest.fixture(scope="module")
def task():
    return CodeTask(seed=3, cases=3, timeout_s=5.0)


def test_items_are_deterministic_per_seed_and_index(task):
    again = CodeTask(seed=3, cases=3, timeout_s=5.0)
    assert [task.item(i) for i in range(20)] == [again.item(i) for i in range(20)]
    assert [task.item(i) for i in range(20)] != [CodeTask(seed=4).item(i) for i in range(20)]


def test_every_family_appears_and_items_are_code_items_with_tests(task):
    items = [task.item(i) for i in range(200)]
    assert {it.meta["family"] for it in items} == set(FAMILIES)
    assert all(it.kind == "code" and it.meta["tests"]["style"] in ("stdio", "function") for it in items)


def test_every_familys_reference_solution_passes_in_the_sandbox(task):
    seen = {}
    for i in range(200):
        item = task.item(i)
        seen.setdefault(item.meta["family"], item)
    for family, item in seen.items():
        score = task.score(item, f"```python\n{item.meta['reference']}```")
        assert (score.reward, score.status) == (1.0, "ok"), (family, score)


def test_a_wrong_program_scores_zero(task):
    item = task.item(0)
    assert task.score(item, "```python\nprint('something else')\n```").reward == 0.0


def test_families_can_be_chosen():
    task = CodeTask(families=["clamp"])
    assert {task.item(i).meta["family"] for i in range(20)} == {"clamp"}


@pytest.mark.parametrize(
    "params,field",
    [
        ({"families": ["nope"]}, "families"),
        ({"families": []}, "families"),
        ({"cases": 0}, "cases"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"sandbox": "docker"}, "sandbox"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_params_are_refused_naming_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        load_task("code", params, 0)
