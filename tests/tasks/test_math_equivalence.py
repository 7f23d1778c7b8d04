import pytest

from tgc_rl.tasks.math_equivalence import verify_math


@pytest.mark.parametrize(
    "answer,response",
    [
        ("\\frac{1}{2}", "so the probability is 0.5"),
        ("(x+1)^2", "$x^2 + 2x + 1$"),
        ("72", "She sold 72 clips in total.\n#### 72"),
        ("1000", "The total is 1,000."),
        ("\\{1,2,3\\}", "$\\{3, 2, 1\\}$"),
        ("5", "The final answer is \\boxed{5}."),
    ],
)
def test_equal_answers_score_one(answer, response):
    score = verify_math(answer, response)
    assert (score.reward, score.status) == (1.0, "ok")


@pytest.mark.parametrize(
    "answer,response",
    [
        ("\\frac{1}{2}", "so the probability is 0.25"),
        ("7", "\\boxed{8}"),
        ("(x+1)^2", "$x^2 + 1$"),
        # the question restated, not answered: math-verify alone finds "75 + 58" equal to 133
        ("133", "To add 75 and 58, you simply add them together: 75 + 58 ="),
        ("5", "x = 2+3"),
    ],
)
def test_different_answers_score_zero(answer, response):
    assert verify_math(answer, response).reward == 0.0


def test_a_response_without_any_answer_says_so():
    assert verify_math("3", "I am not sure.").detail == "no answer found"


def test_the_last_number_rescues_what_math_verify_cannot_read():
    score = verify_math("6", "(6)")
    assert (score.reward, score.detail) == (1.0, "last-number")


def test_it_works_outside_the_main_thread():
    """math-verify's own alarm-based timeouts would raise here; ours are off, the pool enforces deadlines."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        score = ex.submit(verify_math, "\\frac{1}{2}", "0.5").result()
    assert (score.reward, score.status) == (1.0, "ok")
