import numpy as np
import pytest

from tgc_rl.reward.verifier import Verifier, as_score, import_reward
from tgc_rl.tasks import Score, TaskItem

FIXTURES = "tests.reward.reward_fixtures"


def test_builtin_uses_the_tasks_own_verifier():
    verifier = Verifier("arithmetic", {}, 0)
    item = verifier.task.item(0)
    assert verifier(item, item.answer).reward == 1.0
    assert verifier(item, "no number here").reward == 0.0


def test_builtin_math_items_are_widened_by_math_verify():
    item = TaskItem(id="x", prompt="?", answer="\\frac{3}{4}", kind="math")
    score = Verifier("arithmetic", {}, 0)(item, "It is 0.75.")
    assert (score.reward, score.detail) == (1.0, "math-verify")


def test_a_custom_reward_replaces_the_builtin():
    verifier = Verifier("arithmetic", {}, 0, f"{FIXTURES}:judge")
    item = verifier.task.item(0)
    assert verifier(item, "graded") == Score(0.5, detail="half credit")


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("no_colon", "module:function"),
        (f"{FIXTURES}:missing", "cannot import missing"),
        ("not_a_module_anywhere:fn", "cannot import fn"),
        (f"{FIXTURES}:not_callable", "not callable"),
    ],
)
def test_bad_custom_reward_specs_are_refused_naming_task_reward(spec, needle):
    with pytest.raises(ValueError, match="task.reward") as e:
        import_reward(spec)
    assert needle in str(e.value)


@pytest.mark.parametrize("value,reward", [(1, 1.0), (True, 1.0), (0.25, 0.25), (np.float32(0.5), 0.5)])
def test_numbers_become_scores(value, reward):
    assert as_score(value, "fn") == Score(reward)


@pytest.mark.parametrize(
    "value,needle",
    [
        ("1.0", "returned str"),
        (None, "returned NoneType"),
        (float("inf"), "non-finite"),
        (Score(float("nan")), "non-finite"),
    ],
)
def test_anything_else_is_an_error_not_a_silent_zero(value, needle):
    with pytest.raises((TypeError, ValueError), match=needle):
        as_score(value, "fn")
