import pytest

from tgc_rl.sandbox import Sandbox, SandboxLimits
from tgc_rl.tasks.code_tests import CodeTests, extract_program, function_program, score_code

ADD_TESTS = CodeTests(
    style="function", entry_point="add", test="assert add(2, 3) == 5\nassert add(-1, 1) == 0"
)
ECHO_TESTS = CodeTests(style="stdio", cases=(("3\n", "6\n"), ("10\n", "20\n"), ("0\n", "0\n")))


@pytest.fixture(scope="module")
def box():
    return Sandbox(SandboxLimits(wall_s=10.0))


def fenced(code: str, lang: str = "python") -> str:
    return f"Here you go:\n```{lang}\n{code}```\nHope it helps."


# -- extraction ----------------------------------------------------------------------------------------------
def test_the_last_python_block_is_the_program():
    response = fenced("print(1)\n") + "\nBetter:\n" + fenced("print(2)\n")
    assert extract_program(response) == "print(2)\n"


def test_blocks_in_other_languages_are_ignored():
    assert extract_program(fenced("print(1)\n") + fenced("ls -la\n", "bash")) == "print(1)\n"


def test_an_unterminated_block_still_counts():
    assert extract_program("```python\nprint(3)\n") == "print(3)\n"


def test_without_a_block_the_response_is_the_program():
    assert extract_program("print(4)") == "print(4)"


# -- test specs ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"style": "unit"}, "style"),
        ({"style": "stdio"}, "cases"),
        ({"style": "function", "entry_point": "not an identifier", "test": "pass"}, "entry_point"),
        ({"style": "function", "entry_point": "f", "test": "  "}, "test"),
        ({"style": "stdio", "cases": (("", ""),), "timeout_s": 0}, "timeout_s"),
    ],
)
def test_malformed_tests_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CodeTests(**kwargs)


def test_tests_survive_a_trip_through_item_meta():
    assert CodeTests.from_meta({"tests": ECHO_TESTS.to_meta()}) == ECHO_TESTS


def test_missing_tests_in_meta_are_refused():
    with pytest.raises(ValueError, match="meta\\['tests'\\]"):
        CodeTests.from_meta({})


def test_a_body_completion_is_appended_to_the_prompt():
    tests = CodeTests(style="function", entry_point="f", test="assert f(1) == 2", prompt="def f(x):\n")
    program = function_program(tests, "    return x + 1\n")
    assert program.startswith("def f(x):\n    return x + 1\n")


def test_a_whole_definition_keeps_the_prompts_helpers():
    prompt = 'def helper(x):\n    return 2 * x\n\n\ndef f(x):\n    """Double x."""\n'
    tests = CodeTests(
        style="function",
        entry_point="f",
        test="def check(c):\n    assert c(2) == 4\n",
        call_check=True,
        prompt=prompt,
    )
    program = function_program(tests, "def f(x):\n    return helper(x)\n")
    assert program.index("def helper") < program.index("return helper(x)") < program.index("check(f)")


# -- scoring -------------------------------------------------------------------------------------------------
def test_a_correct_function_passes(box):
    score = score_code(box, ADD_TESTS, fenced("def add(a, b):\n    return a + b\n"))
    assert (score.reward, score.status) == (1.0, "ok")


def test_a_wrong_function_fails_with_the_reason(box):
    score = score_code(box, ADD_TESTS, fenced("def add(a, b):\n    return a - b\n"))
    assert (score.reward, score.status) == (0.0, "ok")
    assert "AssertionError" in score.detail


def test_a_correct_stdio_program_passes_every_case(box):
    score = score_code(box, ECHO_TESTS, fenced("print(int(input()) * 2)\n"))
    assert (score.reward, score.detail) == (1.0, "3/3 cases passed")


def test_trailing_whitespace_in_output_is_ignored(box):
    score = score_code(box, ECHO_TESTS, fenced("print(str(int(input()) * 2) + '   \\n\\n')\n"))
    assert score.reward == 1.0


def test_a_wrong_stdio_program_fails_at_its_first_wrong_case(box):
    score = score_code(box, ECHO_TESTS, fenced("n = int(input())\nprint(20 if n == 10 else n)\n"))
    assert score.reward == 0.0 and "case 1/3: wrong output" in score.detail


def test_partial_credit_counts_passing_cases(box):
    score = score_code(
        box,
        ECHO_TESTS,
        fenced("n = int(input())\nprint(20 if n == 10 else 2 * n + 1)\n"),
        partial_credit=True,
    )
    assert score.reward == pytest.approx(1 / 3)


def test_a_looping_program_is_a_wrong_answer_not_a_verifier_error(box):
    tests = CodeTests(style="stdio", cases=(("", "1\n"),), timeout_s=0.5)
    score = score_code(box, tests, fenced("while True:\n    pass\n"))
    assert (score.reward, score.status) == (0.0, "ok")
    assert "timed out" in score.detail
