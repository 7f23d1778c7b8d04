"""The environment written from docs/multi_turn.md (tests/envs/doc_env.py), driven here without a job: its tool
runs in another process and counts as a tool call, its answer turn is scored by the verifier, and a bad param
is refused by name (in the environment's worker this ends the trajectory with `env_error`)."""

import pytest

from tests.envs.scripted import context, drive, run_of
from tgc_rl.envs import EnvBounds, Sample, load_env

NAME = "tests.envs.doc_env:CountingEnv"
GRANTS = frozenset({"custom_code"})


def test_the_tool_counts_in_another_process_and_the_answer_turn_is_scored(template):
    ctx = context(EnvBounds(max_turns=4, max_tool_calls=2))
    env = load_env(NAME, ctx, {"answer_turn": 3}, grants=GRANTS)
    texts = iter(["héllo", "more", "It is 5"])

    def engine(request):
        ids = tuple(template.encode(next(texts)))
        return Sample(ids, (-0.5,) * len(ids), template.decode(list(ids)))

    run = run_of(env, ctx, template)
    drive(run, engine)
    t = run.result()
    assert (t.end_reason, t.turns, t.tool_calls, t.reward) == ("done", 3, 2, 1.0)
    tools = [m.content for m in t.messages if m.role == "tool"]
    assert tools == ["6 bytes", "4 bytes"]  # `wc -c` counts é as two bytes: it ran, not Python's len()


@pytest.mark.parametrize("turn", [0, 9, "2", True])
def test_a_bad_answer_turn_is_refused_by_name(turn):
    with pytest.raises(ValueError, match=r"env\.params\.answer_turn: give an integer from 1 to 8"):
        load_env(NAME, context(), {"answer_turn": turn}, grants=GRANTS)
