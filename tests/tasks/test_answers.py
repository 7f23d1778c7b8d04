import pytest

from tgc_rl.tasks.answers import last_number


@pytest.mark.parametrize(
    "text,expected",
    [
        ("The answer is 42.", "42"),
        ("3 + 4 = 7", "7"),
        ("first \\boxed{12} then 13", "12"),
        ("\\boxed{x = -5}", "-5"),
        ("It costs 1,234 dollars", "1234"),
        ("2.50", "2.5"),
        ("3.000", "3"),
        ("-0", "0"),
        ("no digits at all", None),
        ("", None),
    ],
)
def test_last_number_reads_the_intended_answer(text, expected):
    assert last_number(text) == expected


def test_a_boxed_value_without_a_number_falls_back_to_the_text():
    assert last_number("\\boxed{seven} but 7") == "7"
