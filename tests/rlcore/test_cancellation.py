"""Cancellation on group-common prefixes, measured with diagnostic D1 (docs/objectives.md#shared-nodes-and-cancellation,
docs/diagnostics.md#d1-group-common-prefix-residual)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlcore
from rlcore.diagnostics import ascent_weights, cancellation_diagnostics
from tests.rlcore.batches import make_batch

PRESERVING = [n for n in rlcore.list_objectives() if rlcore.get_objective(n).preserves_cancellation]
BREAKING = [n for n in rlcore.list_objectives() if not rlcore.get_objective(n).preserves_cancellation]


def d1(obj, b, stage_mask=None) -> dict[str, float]:
    adv = obj.advantages(b.rewards, b.group_ids, b.mask)
    w, out = ascent_weights(obj, b.logprobs, b.old_logprobs, adv, b.mask, b.group_ids, stage_mask=stage_mask)
    return cancellation_diagnostics(w, b.token_ids, b.mask, b.group_ids, adv)


def test_the_cancellation_preserving_set_is_the_expected_one():
    assert set(PRESERVING) == {
        "cispo",
        "rloo",
        "dfpo_min",
        "dfpo_orth",
        "cp_grpo",
        "cp_grpo_ar",
        "cp_grpo_lopti",
        "ibpo_cp",
    }


@pytest.mark.parametrize("name", PRESERVING)
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    group_size=st.integers(2, 6),
    off_policy=st.sampled_from([0.0, 0.1, 0.5, 2.0]),
    binary=st.booleans(),
)
def test_preserving_presets_cancel_on_common_prefixes(name, seed, group_size, off_policy, binary):
    b = make_batch(seed, 3, group_size, 8, off_policy=off_policy, binary=binary)
    obj = rlcore.get_objective(name)
    for stage in obj.stages(b.old_logprobs, b.mask):
        diag = d1(obj, b, stage_mask=stage)
        assert diag["diag/d1_gcpr"] <= 1e-6, diag


@pytest.mark.parametrize("name", PRESERVING)
def test_preserving_presets_cancel_in_float32(name):
    b = make_batch(7, 8, 8, 64, off_policy=0.3, dtype=torch.float32)
    diag = d1(rlcore.get_objective(name), b)
    assert diag["diag/d1_groups_measured"] >= 4  # groups whose prefix the symmetric gate zeroed drop out
    assert diag["diag/d1_gcpr"] <= 1e-6, diag


@settings(max_examples=40, deadline=None)
@given(group_size=st.integers(2, 8), data=st.data())
def test_on_policy_grpo_residual_is_length_ratio(group_size, data):
    """rho = |l- - l+| / (l- + l+) on a group-common prefix, binary rewards (docs/objectives.md#length-normalisation)."""
    n_groups = data.draw(st.integers(1, 4))
    width = 12
    rows, expected = [], []
    for _ in range(n_groups):
        k = data.draw(st.integers(1, group_size - 1))  # correct responses
        l_pos, l_neg = data.draw(st.integers(2, width)), data.draw(st.integers(2, width))
        rows.append((k, l_pos, l_neg))
        expected.append(abs(l_neg - l_pos) / (l_neg + l_pos))
    b = make_batch(data.draw(st.integers(0, 1000)), n_groups, group_size, width, off_policy=0.0)
    rewards, lengths = [], []
    for k, l_pos, l_neg in rows:
        rewards += [1.0] * k + [0.0] * (group_size - k)
        lengths += [l_pos] * k + [l_neg] * (group_size - k)
    b.rewards = torch.tensor(rewards, dtype=torch.float64)
    b.mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    b.token_ids = b.token_ids.clone()
    b.token_ids[:, :2] = 1  # every group shares the first two tokens (identical contexts)
    b.token_ids[:, 2] = torch.arange(b.token_ids.shape[0])  # and diverges right after
    b.old_logprobs[:, :2] = b.old_logprobs[0, :2]
    b.logprobs = b.old_logprobs.clone()  # on-policy
    diag = d1(rlcore.get_objective("grpo"), b)
    assert diag["diag/d1_prefix_len_mean"] == 2
    assert diag["diag/d1_gcpr"] == pytest.approx(sum(expected) / len(expected), abs=1e-9)


@pytest.mark.parametrize("name", BREAKING)
def test_breaking_presets_show_a_residual_where_their_mechanism_acts(name):
    """Each preset that claims no cancellation does leave one: unequal lengths on-policy (1/l_i, s_i)
    or, for constant-coefficient ones, a shared token whose ratio left the clip band."""
    b = make_batch(3, 4, 4, 10, off_policy=0.0)
    b.mask = torch.arange(10)[None, :] < torch.tensor([3, 10, 5, 8] * 4)[:, None]
    b.rewards = torch.tensor([1.0, 0.0, 1.0, 0.0] * 4, dtype=torch.float64)
    b.token_ids[:, 0] = 4  # one group-common first token ...
    b.token_ids[:, 1] = torch.arange(16)
    b.old_logprobs[:, 0] = -1.0
    b.logprobs = b.old_logprobs.clone()
    b.logprobs[:, 0] = -1.0 + 0.5  # ... whose ratio e^0.5 = 1.65 left every clip band
    diag = d1(rlcore.get_objective(name), b)
    assert diag["diag/d1_gcpr"] > 0.05, diag
