"""The countdown task: seeded generation whose every item has a solution, and a verifier that reads an expression
with its own bounded parser (exact fractions), refusing wrong values, numbers not given or used twice, junk,
over-long input and division by zero."""

from __future__ import annotations

import random

import pytest

from tgc_rl.cli import main
from tgc_rl.config import JobSpec, SpecError
from tgc_rl.tasks import TaskItem, load_task
from tgc_rl.tasks.countdown import MAX_DEPTH, MAX_EXPRESSION_CHARS, CountdownParams, CountdownTask


def _item(numbers: list[int], target: int) -> TaskItem:
    return TaskItem(id="t", prompt="", kind="custom", meta={"numbers": numbers, "target": target})


def _score(numbers: list[int], target: int, response: str):
    return CountdownTask().score(_item(numbers, target), response)


def test_generation_is_seeded_and_deterministic():
    a, b, other = (
        load_task("countdown", {}, seed=7),
        load_task("countdown", {}, seed=7),
        load_task("countdown", {}),
    )
    assert [a.item(i) for i in range(50)] == [b.item(i) for i in range(50)]
    assert [a.item(i).meta for i in range(50)] != [other.item(i).meta for i in range(50)]
    assert a.item(3) == a.item(3) and a.item(3).id == "countdown-7-3"


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"min_count": 4, "max_count": 4, "max_number": 99, "max_target": 999},
        {"min_count": 2, "max_count": 6, "max_target": 150},
    ],
)
def test_every_generated_item_is_solvable_and_within_its_params(params):
    p = CountdownParams(**params)
    for seed in (0, 1):
        task = load_task("countdown", params, seed=seed)
        counts = set()
        for i in range(300):
            item = task.item(i)
            numbers, target = item.meta["numbers"], item.meta["target"]
            counts.add(len(numbers))
            assert p.min_count <= len(numbers) <= p.max_count
            assert all(p.min_number <= n <= p.max_number for n in numbers)
            assert 1 <= target <= p.max_target and target not in numbers
            assert f"{target}" in item.prompt and ", ".join(map(str, numbers)) in item.prompt
            # the reference solution is an answer the verifier accepts, with and without the tags
            assert task.score(item, f"<answer>{item.answer}</answer>").reward == 1.0, item
            assert task.score(item, f"Let me think.\n{item.answer}").reward == 1.0, item
        assert counts == set(range(p.min_count, p.max_count + 1))


@pytest.mark.parametrize(
    ("numbers", "response"),
    [
        ([25, 4, 3], "<answer>25*4-3</answer>"),
        ([25, 4, 3], "<answer> ( (25 * 4) - 3 ) </answer>"),
        ([25, 4, 3], "First 25 times 4 is 100.\nThen subtract 3.\n4 * 25 - 3 = 97"),
        ([25, 4, 3], "(25 × 4) − 3"),
        ([25, 4, 3], "$25 \\times 4 - 3$."),
        ([25, 4, 3], "<answer>25 + 4</answer> no, better:\n<answer>25*4-3</answer>"),  # the last tag counts
        ([25, 4, 3, 3, 10], "<answer>3 * 25 + 4 * 3 + 10</answer>"),  # a number given twice may be used twice
        ([25, 4, 3, 7], "25 * 4 - 3"),  # not every number has to be used
    ],
)
def test_the_verifier_accepts_a_right_expression_in_several_forms(numbers, response):
    score = _score(numbers, 97, response)
    assert score.reward == 1.0, score


def test_exact_rational_arithmetic_and_repeated_numbers_given_twice():
    assert _score([3, 3, 8, 8], 24, "8 / (3 - 8 / 3)").reward == 1.0  # 8 / (1/3): fractions, not floats
    assert _score([3, 3, 8, 8], 24, "8 / 3 * 9").detail.startswith("9 is not one of the numbers")
    assert _score([6, 6], 1, "6 / 6").reward == 1.0 and _score([6], 1, "6 / 6").reward == 0.0


@pytest.mark.parametrize(
    ("response", "why"),
    [
        ("25 * 4 + 3", "= 103, not 97"),  # wrong value
        (
            "<answer>25 * 4 - 3 - 3 + 3</answer>",
            "3 is not one of the numbers, or is used more often",
        ),  # reuse
        ("25 * 4 - 3 + 0", "0 is not one of the numbers"),  # a number not given
        ("100 - 3", "100 is not one of the numbers"),
        ("-3 + 25 * 4", "unexpected '-'"),  # no unary minus: it would make new numbers
        ("25 ** 4", "unexpected '*'"),
        ("2.5 * 4", "'.' at character 1"),
        ("__import__('os').system('true')", "'_' at character 0"),
        ("25 * (4 - 3", "a '(' is not closed"),
        ("25 * 4 -", "the expression ends too soon"),
        ("25 4 3", "unexpected '4'"),
        ("", "the expression ends too soon"),
        ("<answer></answer>", "the expression ends too soon"),
    ],
)
def test_the_verifier_refuses_wrong_values_other_numbers_and_junk(response, why):
    score = _score([25, 4, 3], 97, response)
    assert score.reward == 0.0 and score.status == "ok" and why in score.detail, score


def test_division_by_zero_is_a_wrong_answer_not_an_error():
    score = _score([5, 5, 2], 2, "2 / (5 - 5)")
    assert score.reward == 0.0 and score.status == "ok" and score.detail == "division by zero"


def test_over_long_and_deeply_nested_input_is_refused_before_or_while_parsing():
    long = "(" * 200 + "25 * 4 - 3" + ")" * 200
    assert len(long) > MAX_EXPRESSION_CHARS
    assert f"at most {MAX_EXPRESSION_CHARS} are read" in _score([25, 4, 3], 97, long).detail
    deep = "(" * (MAX_DEPTH + 1) + "25" + ")" * (MAX_DEPTH + 1) + " * 4 - 3"
    assert len(deep) <= MAX_EXPRESSION_CHARS
    assert f"parentheses nested deeper than {MAX_DEPTH}" in _score([25, 4, 3], 97, deep).detail
    ok = "(" * MAX_DEPTH + "25" + ")" * MAX_DEPTH + " * 4 - 3"
    assert _score([25, 4, 3], 97, ok).reward == 1.0
    # a huge response costs one pass: only its last tag or line is read
    assert _score([25, 4, 3], 97, "<answer>" * 100_000 + "1 + 2\n" * 100_000 + "25*4-3").reward == 1.0


def test_random_strings_get_a_verdict_never_an_exception():
    rng = random.Random(0)
    alphabet = "0123456789+-*/() 253.x=<>answer"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        score = _score([2, 5, 3, 3], 6, text)
        assert score.status == "ok" and score.reward in (0.0, 1.0) and score.detail, text


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"min_count": 5, "max_count": 4}, "need min_count <= max_count"),
        ({"min_number": 9, "max_number": 3}, "need min_number <= max_number"),
        ({"max_number": 99}, "max_target=100 is below max_count * max_number = 396"),
        ({"max_count": 7}, "task.params.max_count"),
        ({"template": "Reach {target}."}, "task.params.template: missing the slot(s) {numbers}"),
        ({"template": "{numbers:>99} {target}"}, "a format spec"),
        ({"numbers": [1, 2]}, "task.params.numbers: unknown field"),
    ],
)
def test_bad_params_are_refused_where_the_spec_is_parsed(params, field):
    with pytest.raises(SpecError, match=r"task\.params") as e:
        JobSpec.parse({"task": {"name": "countdown", "params": params}})
    assert field in str(e.value)


def test_the_spec_the_schema_and_export_know_it_from_its_registry_entry(capsys, tmp_path):
    spec = JobSpec.parse({"task": {"name": "countdown", "params": {"max_count": 3}}})
    assert isinstance(spec.task.params, CountdownParams) and spec.to_dict()["task"]["params"] == {
        "max_count": 3
    }
    assert main(["schema", "--task", "countdown"]) == 0 and "max_target" in capsys.readouterr().out
    # export would turn its items into rows whose answer a math or exact verifier reads: not offered
    assert main(["data", "export", "--task", "countdown", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "countdown" not in capsys.readouterr().err.split("export a built-in task", 1)[1]
