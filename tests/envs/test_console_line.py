"""The console's one line per step: a multi-turn step adds turns per trajectory and tool calls after the headline
metrics; a single-turn step's line is the headline metrics alone (HEADLINE_METRICS does not grow)."""

from tgc_rl.run_layout import (
    HEADLINE_METRICS,
    MT_TOOL_CALLS,
    MT_TURNS_PER_TRAJECTORY,
    REWARD_MEAN,
    TIMING_STEP,
)
from tgc_rl.trainer.metrics import step_line


def test_a_multi_turn_step_shows_turns_and_tool_calls_and_a_single_turn_step_does_not():
    single = {REWARD_MEAN: 0.25, TIMING_STEP: 12.0, "multi_turn/tool_errors": 1.0}
    assert step_line(3, 15, single) == "step 3/15  reward 0.25  s/step 12"
    multi = {**single, MT_TURNS_PER_TRAJECTORY: 1.875, MT_TOOL_CALLS: 7.0}
    assert step_line(3, 15, multi) == "step 3/15  reward 0.25  s/step 12  turns 1.88  tools 7"
    assert {h.name for h in HEADLINE_METRICS}.isdisjoint({MT_TURNS_PER_TRAJECTORY, MT_TOOL_CALLS})
