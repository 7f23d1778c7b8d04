"""The multi-turn group rule (tgc_rl/trainer/multi_turn.py): failed trajectories stay in their group but are
filtered before centring (advantages(keep=)), a group left with < 2 is dropped and counted, a trajectory without
a model token drops its group (groups keep G rows), and the step's counters."""

from types import SimpleNamespace

import pytest

import rlcore
from tgc_rl.config import SamplingSpec
from tgc_rl.envs import Trajectory
from tgc_rl.envs.tokens import Span
from tgc_rl.run_layout import (
    MT_BOUND_HITS,
    MT_BRIDGE_FAILURES,
    MT_DROPPED_GROUPS,
    MT_DROPPED_TRAJECTORIES,
    MT_MODEL_TOKENS,
    MT_OBSERVATION_TOKENS,
    MT_TOOL_CALLS,
    MT_TRAJECTORIES,
    MT_TURNS_PER_TRAJECTORY,
)
from tgc_rl.tasks import TaskItem
from tgc_rl.trainer.credit import ObjectiveCredit
from tgc_rl.trainer.data import Prompt
from tgc_rl.trainer.loop import Group, Trainer
from tgc_rl.trainer.multi_turn import group_trajectories, with_means

PROMPT = (1, 2, 3)


def traj(end: str = "done", reward: float = 0.0, model: int = 2, turns: int = 2, prompt=PROMPT) -> Trajectory:
    ids = [*prompt, *[10 + model] * model, 7, 8, *[20] * model]
    p, spans = len(prompt), []
    spans = [Span("prompt", 0, p), Span("model", p, p + model), Span("context", p + model, p + model + 2)]
    spans.append(Span("model", p + model + 2, len(ids)))
    spans = [s for s in spans if s.end > s.start]
    mask = [int(any(s.kind == "model" and s.start <= i < s.end for s in spans)) for i in range(len(ids))]
    return Trajectory(
        token_ids=tuple(ids),
        loss_mask=tuple(mask),
        logprobs=tuple(-0.5 * m for m in mask),
        spans=tuple(spans),
        prompt_len=p,
        reward=reward,
        end_reason=end,  # type: ignore[arg-type]
        detail="",
        turns=turns,
        tool_calls=1,
        tool_errors=0,
        tool_timeouts=0,
        observation_truncations=0,
        messages=(),
    )


def prompts(n: int) -> list[Prompt]:
    return [Prompt(i, TaskItem(id=str(i), prompt="q"), [99]) for i in range(n)]


def test_failed_trajectories_are_filtered_before_centring():
    trajs = [traj(reward=1.0), traj(), traj("bridge", 1.0), traj(reward=1.0, end="max_turns")]
    groups, m = group_trajectories(prompts(1), trajs, [0] * 4, 4)
    (g,) = groups
    assert g.keep == [True, True, False, True] and g.prompt.token_ids == list(PROMPT)
    assert [c.model_mask for c in g.completions][0] == [True, True, False, False, True, True]
    trainer = SimpleNamespace(
        credit=ObjectiveCredit(rlcore.get_objective("cp_grpo"), SamplingSpec()),
        tokenizer=SimpleNamespace(pad_token_id=0),
    )
    batch, _ = Trainer.build_batch(trainer, [Group(g.prompt, g.completions, g.scores, keep=g.keep)])  # type: ignore[arg-type]
    adv = batch.advantages
    assert adv[2] == 0 and abs(float(adv.sum())) < 1e-6  # the failed one carries nothing; the group sums to 0
    assert adv[0] == adv[3] > 0 > adv[1]  # centred over the 3 kept (mean 2/3), not over all 4
    assert m[MT_DROPPED_TRAJECTORIES] == 1 and m[MT_DROPPED_GROUPS] == 0 and m[MT_BRIDGE_FAILURES] == 1
    assert m[f"{MT_BOUND_HITS}/max_turns"] == 1


@pytest.mark.parametrize(
    "trajs",
    [
        [traj(), traj("deadline"), traj("env_error"), traj("bridge")],  # fewer than 2 left to centre over
        [traj(), traj(), traj(), traj("env_error", model=0)],  # no model token: cannot be a batch row
        [traj(), traj(), traj(), traj(prompt=(1, 2, 4))],  # no shared first prompt
    ],
)
def test_a_group_that_cannot_be_centred_is_dropped_and_counted(trajs):
    groups, m = group_trajectories(prompts(2), [traj(), traj(reward=1.0), traj(), traj()] + trajs, [0] * 8, 4)
    assert [g.prompt.index for g in groups] == [0]
    assert m[MT_DROPPED_GROUPS] == 1 and m[MT_DROPPED_TRAJECTORIES] == 4 and m[MT_TRAJECTORIES] == 8


def test_the_counters_sum_over_trajectories_and_give_turns_per_trajectory():
    trajs = [traj(turns=1), traj(turns=3), traj(turns=2, model=1), traj(turns=2, end="max_total_tokens")]
    _, m = group_trajectories(prompts(1), trajs, [0] * 4, 4)
    assert m[MT_TOOL_CALLS] == 4 and m[MT_MODEL_TOKENS] == 4 + 4 + 2 + 4
    assert m[MT_OBSERVATION_TOKENS] == 2 * 4 and m[f"{MT_BOUND_HITS}/max_total_tokens"] == 1
    assert with_means(m) == {MT_TURNS_PER_TRAJECTORY: 2.0}
