import pytest

from tgc_rl.tasks import load_task
from tgc_rl.tasks.gym import ReasoningGymTask, candidate_answers


@pytest.fixture(scope="module")
def task():
    return load_task("reasoning_gym:basic_arithmetic", {"size": 50}, 1)


def test_items_are_deterministic_per_seed(task):
    again = ReasoningGymTask("basic_arithmetic", seed=1, size=50)
    assert [task.item(i).prompt for i in range(5)] == [again.item(i).prompt for i in range(5)]
    assert task.item(0).kind == "gym" and task.name == "reasoning_gym:basic_arithmetic"


def test_the_stream_repeats_after_size_items(task):
    assert task.item(3).prompt == task.item(53).prompt


def test_the_gold_answer_scores_one(task):
    for i in range(5):
        item = task.item(i)
        assert task.score(item, item.answer).reward == 1.0


@pytest.mark.parametrize(
    "wrap", ["The answer is {}", "<answer>{}</answer>", "\\boxed{{{}}}", "Let me see.\n{}"]
)
def test_answers_are_read_leniently(task, wrap):
    item = task.item(0)
    assert task.score(item, wrap.format(item.answer)).reward == 1.0


def test_an_answer_tag_is_taken_at_its_word(task):
    item = task.item(0)
    assert task.score(item, f"{item.answer}\n<answer>123456789</answer>").reward == 0.0


def test_a_wrong_answer_scores_zero(task):
    item = task.item(0)
    assert task.score(item, "<answer>123456789</answer>").reward == 0.0
    assert task.score(item, "").reward == 0.0


def test_dataset_config_reaches_the_generator():
    task = load_task(
        "reasoning_gym:basic_arithmetic",
        {"size": 10, "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        0,
    )
    item = task.item(0)
    assert len(item.meta["entry"]["metadata"]["expression"].split()) == 3


def test_other_datasets_use_their_own_scorer():
    task = load_task("reasoning_gym:countdown", {"size": 5}, 0)
    item = task.item(0)
    assert task.score(item, item.answer).reward == 1.0
    assert task.score(item, "1 + 1").reward < 1.0


def test_candidate_answers_go_from_explicit_to_lenient():
    assert candidate_answers("x <answer> 4 </answer>") == ["4"]
    assert candidate_answers("so \\boxed{12}\nthen 13") == ["12", "so \\boxed{12}\nthen 13", "then 13"]
    assert candidate_answers("I think it is 5 or so") == ["I think it is 5 or so", "5"]


@pytest.mark.parametrize(
    "name,params,needle",
    [
        ("reasoning_gym:no_such_dataset", {}, "no_such_dataset"),
        ("reasoning_gym:basic_arithmetic", {"bogus_field": 1}, "bogus_field"),
        ("reasoning_gym:basic_arithmetic", {"size": 0}, "size"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(name, params, needle):
    with pytest.raises(ValueError, match=needle):
        load_task(name, params, 0)
