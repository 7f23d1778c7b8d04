"""The learner on multi-turn trajectories (loss masks with holes, docs/objectives.md#multi-turn-credit): a
step's D2 stays at float rounding for cp_grpo on deep shared prefixes (an identical first tool call and its
deterministic output) while grpo's is clearly above it. The shared-prompt forward's equality with holes is
in test_prefix_tree.py."""

from __future__ import annotations

import pytest
import torch

from tests.learner.test_prefix_tree import _one_thread, multi_turn  # noqa: F401 (the autouse fixture)
from tgc_rl.batch import Completion, Segment, collate
from tgc_rl.learner import Learner
from tgc_rl.learner.plan import group_spans


def test_segments_collate_to_one_response_with_holes_and_engine_logprobs_on_model_tokens():
    segments = [Segment([5, 6], [-0.5, -1.0]), Segment([7, 8, 9]), Segment([10], [-2.0])]
    comp = Completion.from_segments(segments, "stop", 3)
    b = collate([[1, 2]] * 2, [comp, Completion([5], [-0.1], "stop", 3)], [0, 0], torch.zeros(2), pad_id=0)
    assert b.response_ids[0].tolist() == [5, 6, 7, 8, 9, 10]
    assert b.response_mask[0].tolist() == [1, 1, 0, 0, 0, 1] and b.history_mask[0].tolist() == [1] * 6
    assert b.rollout_logprobs[0].tolist() == [-0.5, -1.0, 0, 0, 0, -2.0]
    assert b.history_mask[1].tolist() == [1, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"segments\[1\].logprobs: 1 entries for 3 token_ids"):
        Completion.from_segments([segments[0], Segment([7, 8, 9], [-1.0])], "stop", 3)


def test_the_batch_has_holes_and_the_plan_counts_observations_as_tree_nodes():
    b = multi_turn(0)
    assert bool((b.history_mask.bool() & ~b.response_mask.bool()).any())  # observations inside responses
    g = group_spans(b)[0]
    prompt = int(b.attention_mask[0, : b.prompt_len].sum())
    assert g.tree_tokens == prompt + int(b.history_mask[g.start : g.stop].sum())


@pytest.mark.parametrize("objective", ["cp_grpo", "grpo"])
def test_a_step_keeps_d2_at_rounding_across_turns_for_cp_grpo_only(learner_spec, tiny_model_path, objective):
    batch = multi_turn(0, objective)
    spec = learner_spec(**{"objective.name": objective, "optim.micro_batch_size": 4})
    m = Learner(spec, tiny_model_path).train_step(batch)
    assert m["diag/d2_nodes"] > 0 and m["diag/d2_depth_max"] > 9  # past the first call and its output
    assert m["mismatch/shared_pairs"] > 0
    if objective == "cp_grpo":
        assert m["diag/d2_residual"] < 1e-5 and m["diag/d1_gcpr"] < 1e-5
    else:
        assert m["diag/d2_residual"] > 0.05
