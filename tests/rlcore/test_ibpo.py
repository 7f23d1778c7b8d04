"""IBPO: the comparison signal, shaping before centring, the token alignment and both credit masks vs D1/D2."""

import numpy as np
import pytest
import torch

import rlcore
from rlcore import ibpo

from .batches import make_batch, multi_turn_batch

# -- phi and shaping ----------------------------------------------------------------------------------


def test_phi_is_rho_only_for_repaired_incorrect_responses():
    correct = torch.tensor([True, False, False, False, True])
    revised = torch.tensor([True, True, False, True, True])
    attempted = torch.tensor([False, True, True, False, False])
    phi = ibpo.comparison_signal(correct, revised, attempted, rho=0.5)
    # correct responses get 0 whatever their "revision"; an unattempted revision counts as a failure
    assert phi.tolist() == [0.0, 0.5, 0.0, 0.0, 0.0]


def test_phi_refuses_misshaped_inputs():
    with pytest.raises(ValueError, match="revised_correct"):
        ibpo.comparison_signal(
            torch.zeros(3, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool),
            torch.zeros(3, dtype=torch.bool),
        )


@pytest.mark.parametrize("name", ["cp_grpo", "grpo", "dr_grpo", "rloo", "ibpo_cp"])
@pytest.mark.parametrize("seed", range(3))
def test_shaping_before_centring_keeps_group_sums_zero(name, seed):
    b = make_batch(seed, n_groups=4, group_size=8)
    obj = rlcore.get_objective(name)
    phi = 0.5 * (torch.rand(b.rewards.shape[0], generator=torch.Generator().manual_seed(seed)) < 0.5).double()
    phi[b.rewards >= 1] = 0
    adv = ibpo.shaped_advantages(obj.config, b.rewards, b.group_ids, b.mask, phi, lam=0.6)
    sums = torch.zeros(int(b.group_ids.max()) + 1, dtype=adv.dtype).index_add_(0, b.group_ids, adv)
    assert sums.abs().max() < 1e-9
    # R' = R + lam * phi: equal to the objective's own advantages of the shaped rewards
    ref = obj.advantages(b.rewards + 0.6 * phi, b.group_ids, b.mask)
    assert torch.allclose(adv, ref, atol=1e-12)


def test_repaired_responses_rank_between_correct_and_irreparable():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    phi = torch.tensor([0.0, 0.5, 0.0, 0.0])
    adv = ibpo.shaped_advantages(
        rlcore.resolve("cp_grpo"), rewards, torch.zeros(4, dtype=torch.long), torch.ones(4, 3), phi, lam=0.6
    )
    assert adv[0] > adv[1] > adv[2] == adv[3]


def test_ibpo_cp_preset_preserves_cancellation_and_carries_lambda():
    obj = rlcore.get_objective("ibpo_cp")
    assert obj.preserves_cancellation and obj.config.bonus_coef == pytest.approx(0.6)
    cp = rlcore.resolve("cp_grpo")
    assert {k: v for k, v in obj.config.as_dict().items() if k != "bonus_coef"} == {
        k: v for k, v in cp.as_dict().items() if k != "bonus_coef"
    }


def test_verdict_tells_the_masks_apart():
    cfg = rlcore.resolve("cp_grpo")
    assert ibpo.verdict(cfg, "none") == (True, [])
    assert ibpo.verdict(cfg, "symmetric") == (True, [])
    ok, reasons = ibpo.verdict(cfg, "naive")
    assert not ok and "symmetric" in reasons[0]
    assert not ibpo.verdict(rlcore.resolve("grpo"), "symmetric")[0]  # the objective's own reasons stay
    assert ibpo.verdict(rlcore.resolve("dfpo_orth"), "none")[0]
    assert not ibpo.verdict(rlcore.resolve("dfpo_orth"), "symmetric")[0]  # orth reads the masked advantages


@pytest.mark.parametrize("name", rlcore.list_objectives())
def test_verdict_with_the_symmetric_mask_matches_d1_d2_on_policy(name):
    """Every preset with the symmetric mask: where the verdict says it cancels, D1 and D2 vanish on random
    prefix trees (on-policy, so the PPO-gated presets cancel too; their verdict is about off-policy steps)."""
    b, phi, edits = _ibpo_batch(1)
    obj = rlcore.get_objective(name)
    adv = ibpo.shaped_advantages(obj.config, b.rewards, b.group_ids, b.mask, phi, lam=0.6)
    credit = ibpo.credit_mask("symmetric", edits, b.token_ids, b.mask, b.group_ids)
    d = ibpo.mask_diagnostics(obj, adv, credit, b.old_logprobs, b.token_ids, b.mask, b.group_ids)
    if ibpo.verdict(obj.config, "symmetric")[0]:
        assert d["d1_gcpr"] < 1e-9 and d["d2_residual"] < 1e-9
    elif name == "dfpo_orth":
        assert d["d1_gcpr"] > 1e-3


# -- alignment ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, edited",
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], []),  # identical: nothing edited
        ([1, 2, 3, 4], [1, 9, 3, 4], [1]),  # substitution
        ([1, 2, 3, 4], [1, 3, 4], [1]),  # deletion of a token of y
        ([1, 2, 3, 4], [1, 2, 7, 3, 4], [2]),  # insertion: charged to the token after the insertion point
        ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [3]),  # appended: charged to the last token
        ([1, 2, 3, 4], [0, 1, 2, 3, 4], [0]),  # prepended: the first token
        (
            [1, 2, 3, 4, 5, 6],
            [1, 8, 3, 4, 9, 6, 7],
            [1, 4, 5],
        ),  # mixed; the insertion at the end marks the last
        ([5, 5, 5], [], [0, 1, 2]),  # everything deleted
        ([], [1, 2], []),
        ([1, 2, 3], [4, 5, 6], [0, 1, 2]),
    ],
)
def test_edit_mask_hand_built_cases(a, b, edited):
    got = ibpo.edit_mask(a, b)
    assert got.dtype == bool and got.shape == (len(a),)
    assert np.flatnonzero(got).tolist() == edited


def _is_subsequence(x: list[int], y: list[int]) -> bool:
    it = iter(y)
    return all(v in it for v in x)


def test_edit_mask_keeps_a_common_subsequence_of_an_optimal_alignment():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = rng.integers(0, 4, rng.integers(1, 12)).tolist()
        b = rng.integers(0, 4, rng.integers(0, 12)).tolist()
        edited = ibpo.edit_mask(a, b)
        kept = [v for v, e in zip(a, edited, strict=True) if not e]
        assert _is_subsequence(kept, b)
        # substitutions + deletions + charged insertions <= the distance: no token is edited needlessly
        assert int(edited.sum()) <= ibpo.levenshtein(a, b)


def test_edit_mask_of_a_huge_middle_marks_it_edited(monkeypatch):
    monkeypatch.setattr(ibpo, "MAX_ALIGN_CELLS", 10)
    got = ibpo.edit_mask([1, 2, 3, 4, 5, 6], [1, 9, 8, 7, 6])
    assert got.tolist() == [False, True, True, True, True, False]


# -- credit masks vs D1 / D2 --------------------------------------------------------------------------


def _ibpo_batch(seed: int, group_size: int = 6):
    """A random prefix-tree batch; every incorrect response was revised, about half successfully, and each
    successful revision edited a random subset of its tokens."""
    b = make_batch(seed, n_groups=5, group_size=group_size, width=10)
    g = torch.Generator().manual_seed(100 + seed)
    correct = b.rewards >= 1
    revised = torch.rand(correct.shape[0], generator=g) < 0.6
    phi = ibpo.comparison_signal(correct, revised, ~correct, rho=0.5)
    lengths = b.mask.sum(1)
    rng = np.random.default_rng(seed)
    edits = [
        rng.random(int(n)) < 0.4 if p > 0 else None
        for p, n in zip(phi.tolist(), lengths.tolist(), strict=True)
    ]
    return b, phi, edits


@pytest.mark.parametrize("seed", range(6))
def test_naive_mask_breaks_cancellation_symmetric_keeps_it(seed):
    b, phi, edits = _ibpo_batch(seed)
    obj = rlcore.get_objective("ibpo_cp")
    adv = ibpo.shaped_advantages(obj.config, b.rewards, b.group_ids, b.mask, phi, lam=0.6)
    results = {}
    for variant in ("none", "naive", "symmetric"):
        credit = ibpo.credit_mask(variant, edits, b.token_ids, b.mask, b.group_ids)
        results[variant] = ibpo.mask_diagnostics(
            obj, adv, credit, b.old_logprobs, b.token_ids, b.mask, b.group_ids
        )
    for variant in ("none", "symmetric"):
        assert results[variant]["d1_gcpr"] < 1e-9 and results[variant]["d2_residual"] < 1e-9, variant
    assert results["naive"]["d2_residual"] > 1e-3
    assert results["naive"]["d1_gcpr"] > 1e-3


@pytest.mark.parametrize("seed", range(3))
def test_symmetric_mask_keeps_cancellation_off_policy(seed):
    """The same with the learner's real situation: current != sampling log-probs (the IS weight and the gate
    are node-local, so one mask decision per node keeps every copy exchangeable)."""
    b, phi, edits = _ibpo_batch(seed)
    obj = rlcore.get_objective("ibpo_cp")
    adv = ibpo.shaped_advantages(obj.config, b.rewards, b.group_ids, b.mask, phi, lam=0.6)
    out = {}
    for variant in ("naive", "symmetric"):
        credit = ibpo.credit_mask(variant, edits, b.token_ids, b.mask, b.group_ids)
        w, _ = rlcore.ascent_weights(
            obj, b.logprobs, b.old_logprobs, adv[:, None] * credit, b.mask, b.group_ids
        )
        out[variant] = rlcore.cancellation_diagnostics(w, b.token_ids, b.mask, b.group_ids, adv)
    assert out["symmetric"]["diag/d2_residual"] < 1e-9 and out["symmetric"]["diag/d1_gcpr"] < 1e-9
    assert out["naive"]["diag/d2_residual"] > 1e-3


def test_symmetric_mask_decides_per_node():
    # group of three: rows 0 and 1 share their first two tokens, row 2 shares only the first with them
    tokens = torch.tensor([[1, 2, 3, 4], [1, 2, 5, 6], [1, 7, 8, 9]])
    mask = torch.ones(3, 4)
    gids = torch.zeros(3, dtype=torch.long)
    naive = ibpo.naive_credit_mask([None, np.array([0, 0, 1, 0], bool), np.array([0, 1, 0, 1], bool)], mask)
    sym = ibpo.symmetric_credit_mask(naive, tokens, mask, gids)
    assert naive.tolist() == [[1, 1, 1, 1], [0, 0, 1, 0], [0, 1, 0, 1]]
    # position 0: one node of all three, kept by row 0 -> kept everywhere; position 1: rows 0/1 share a node
    # (kept by row 0), row 2 is alone there; later positions are unshared and keep the naive decision
    assert sym.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 1]]


def test_masks_respect_the_response_mask():
    tokens = torch.tensor([[1, 2, 0], [1, 2, 3]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    gids = torch.zeros(2, dtype=torch.long)
    naive = ibpo.naive_credit_mask([np.array([1, 0], bool), None], mask)
    assert naive.tolist() == [[1, 0, 0], [1, 1, 1]]
    sym = ibpo.symmetric_credit_mask(naive, tokens, mask, gids)
    assert sym.tolist() == [[1, 1, 0], [1, 1, 1]]
    with pytest.raises(ValueError, match="edits\\[0\\]"):
        ibpo.naive_credit_mask([np.array([1, 0, 1], bool), None], mask)


# -- multi-turn: alignment over model tokens, credit on a real multi-turn batch ------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_segment_alignment_on_one_segment_is_todays_edit_mask(seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 6, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
    b = torch.randint(0, 6, (int(torch.randint(0, 30, (1,), generator=g)),), generator=g).tolist()
    expected = ibpo.edit_mask(a, b)
    assert (ibpo.segment_edit_mask(a, b) == expected).all()
    assert (ibpo.segment_edit_mask(a, b, [True] * len(a), [True] * len(b)) == expected).all()


def test_segment_alignment_skips_observations_on_both_sides():
    # response: model [1 2 3], observation [7 7], model [4 5]; revision: model [1 2 3], another observation
    # [8 8 8] (the tool answered otherwise), model [4 6]
    resp, resp_model = [1, 2, 3, 7, 7, 4, 5], [True] * 3 + [False] * 2 + [True] * 2
    rev, rev_model = [1, 2, 3, 8, 8, 8, 4, 6], [True] * 3 + [False] * 3 + [True] * 2
    out = ibpo.segment_edit_mask(resp, rev, resp_model, rev_model)
    assert out.tolist() == [False, False, False, False, False, False, True]  # only 5 -> 6
    # aligned as the model's tokens: equal to the one-segment mask of the model tokens, False on observations
    assert (out[np.asarray(resp_model)] == ibpo.edit_mask([1, 2, 3, 4, 5], [1, 2, 3, 4, 6])).all()
    # an insertion at the end of a turn is charged to the next turn's first model token, never to an observation
    out = ibpo.segment_edit_mask(
        resp, [1, 2, 3, 9, 7, 7, 4, 5], resp_model, [True] * 4 + [False] * 2 + [True] * 2
    )
    assert out.tolist() == [False, False, False, False, False, True, False]
    with pytest.raises(ValueError, match="response_model: 2 entries for 7 token ids"):
        ibpo.segment_edit_mask(resp, rev, [True, False], rev_model)


def _row_segments(batch, i):
    """Row i of a collated multi-turn batch: its tokens after the prompt and which of them the model sampled."""
    n = int(batch.history_mask[i].sum())
    return batch.response_ids[i, :n].tolist(), batch.response_mask[i, :n].bool().tolist()


def _multi_turn_ibpo(seed: int, variant: str, present: bool = True):
    """One IBPO step of ibpo_cp on a real multi-turn batch (tests/rlcore/batches.py: deep prefixes shared through
    a deterministic tool's output): every other incorrect trajectory is 'repaired' by a revision that rewrites
    its last model turn and, in the revision's own environment, gets a longer tool output; the deadline-hit
    trajectory of each group is filtered before centring. Returns (batch, credit mask, diagnostics)."""
    m = multi_turn_batch(seed)
    b = m.batch
    obj = rlcore.get_objective("ibpo_cp")
    g = torch.Generator().manual_seed(100 + seed)
    correct = b.rewards >= 1.0
    keep = torch.ones(len(b), dtype=torch.bool)
    keep[3::4] = False
    attempted = ~correct & keep
    revised = attempted & (torch.rand(len(b), generator=g) < 0.7)
    phi = ibpo.comparison_signal(correct, revised, attempted, 0.5)
    edits: list = [None] * len(b)
    for i in revised.nonzero().flatten().tolist():
        ids, model = _row_segments(b, i)
        last = max(t for t, x in enumerate(model) if x)
        rev_ids = ids[:last] + torch.randint(10, 200, (3,), generator=g).tolist()
        rev_model = model[:last] + [True] * 3
        # the revision's tool answered with one more token: observations are not aligned
        first_obs = model.index(False)
        rev_ids.insert(first_obs, 1)
        rev_model.insert(first_obs, False)
        full = ibpo.segment_edit_mask(ids, rev_ids, model, rev_model)
        assert not full[~np.asarray(model)].any()  # no observation token is ever edited
        edits[i] = full[np.asarray(model)]
    adv = ibpo.shaped_advantages(obj.config, b.rewards, b.group_ids, b.response_mask, phi, 0.6, keep)
    hist = b.history_mask if present else None  # where the mask finds its nodes; the diagnostics: the history
    credit = ibpo.credit_mask(variant, edits, b.response_ids, b.response_mask, b.group_ids, hist)
    diag = ibpo.mask_diagnostics(
        obj, adv, credit, b.rollout_logprobs, b.response_ids, b.response_mask, b.group_ids, b.history_mask
    )
    return b, adv, credit, diag


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cp_grpo_with_ibpo_keeps_d2_at_rounding_on_a_real_multi_turn_batch(seed):
    b, adv, credit, sym = _multi_turn_ibpo(seed, "symmetric")
    assert bool((credit[b.response_mask == 0] == 0).all())  # observations never get credit
    assert bool((adv[3::4] == 0).all())  # filtered before centring: no credit
    for gid in b.group_ids.unique():
        assert abs(float(adv[b.group_ids == gid].sum())) < 1e-6  # and every group still sums to 0
    assert sym["d2_nodes"] > 0 and sym["d1_groups_measured"] == 3
    assert sym["d2_residual"] < 1e-9 and sym["d1_gcpr"] < 1e-9
    _, _, _, none = _multi_turn_ibpo(seed, "none")
    assert none["d2_residual"] < 1e-9
    _, _, naive_credit, naive = _multi_turn_ibpo(seed, "naive")
    assert (naive_credit != credit).any() and naive["d2_residual"] > 1e-3  # the naive mask does not cancel


def test_the_symmetric_mask_must_find_nodes_on_the_history_not_on_the_loss_mask():
    """Decided on the loss mask (holes at observations), the nodes past the first tool output are not seen as
    shared: their naive decision stays and copies differ."""
    residuals = [_multi_turn_ibpo(seed, "symmetric", present=False)[3]["d2_residual"] for seed in range(3)]
    assert max(residuals) > 1e-3


def test_verdict_across_turns_keeps_the_single_turn_one_and_names_what_breaks_it():
    from rlcore.config import TrajectoryCredit

    cfg = rlcore.get_objective("ibpo_cp").config
    assert ibpo.verdict(cfg, "symmetric", TrajectoryCredit()) == ibpo.verdict(cfg, "symmetric") == (True, [])
    for credit, word in (
        (TrajectoryCredit(reward="per_turn"), "per_turn"),
        (TrajectoryCredit(normaliser="turn"), "normaliser='turn'"),
        (TrajectoryCredit(filter="after_centring"), "after_centring"),
    ):
        ok, reasons = ibpo.verdict(cfg, "symmetric", credit)
        assert not ok and any(word in r for r in reasons), reasons
    ok, reasons = ibpo.verdict(cfg, "naive", TrajectoryCredit())
    assert not ok and any("mask='naive'" in r for r in reasons)
