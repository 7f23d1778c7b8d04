"""The transformers engine: shapes, EOS, seeded reproducibility, sampling log-probs, in-place weight updates."""

import pytest
import torch

from tests.rollout.rollout_helpers import (
    EOS,
    PROMPTS,
    eos_prone,
    perturbed,
    reference_logprobs,
    reference_model,
    replica_spec,
)
from tgc_rl.rollout.hf_engine import HFEngine, top_p_mask


@pytest.fixture(scope="module")
def engine(tiny_path, tiny_state):
    torch.set_num_threads(1)
    eng = HFEngine(replica_spec("hf"), tiny_path)
    yield eng
    eng.close()


@pytest.fixture
def fresh_weights(engine, tiny_state):
    """Tests that load other weights put the initial ones back afterwards."""
    yield
    engine.update_weights(tiny_state, 0)


def test_generate_returns_n_completions_per_prompt_with_aligned_logprobs(engine):
    out = engine.generate(PROMPTS, 3, [0, 1, 2])
    assert [len(cs) for cs in out] == [3, 3, 3]
    for cs in out:
        for c in cs:
            assert 1 <= len(c.token_ids) <= 12 and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert c.version == engine.version
            # a random-init model almost never says EOS: the budget runs out
            assert c.finish_reason == "length" and len(c.token_ids) == 12


def test_same_seeds_give_the_same_samples_whatever_the_batch(engine):
    alone = engine.generate([PROMPTS[1]], 4, [7])[0]
    batched = engine.generate(PROMPTS, 4, [3, 7, 9])[1]
    assert [c.token_ids for c in alone] == [c.token_ids for c in batched]
    for a, b in zip(alone, batched, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_different_seeds_and_samples_differ(engine):
    a = engine.generate([PROMPTS[0]], 4, [1])[0]
    b = engine.generate([PROMPTS[0]], 4, [2])[0]
    assert len({tuple(c.token_ids) for c in a}) == 4  # the 4 samples of a prompt are not copies
    assert [c.token_ids for c in a] != [c.token_ids for c in b]


def test_sampling_logprobs_are_the_tempered_distribution(tiny_path):
    eng = HFEngine(replica_spec("hf", temperature=0.7), tiny_path)
    c = eng.generate([PROMPTS[0]], 1, [5])[0][0]
    ref = reference_logprobs(eng.model, PROMPTS[0] + c.token_ids, len(PROMPTS[0]), temperature=0.7)
    assert c.logprobs == pytest.approx(ref, abs=1e-4)


def test_generation_stops_at_eos_and_keeps_it(engine, tiny_state, fresh_weights):
    engine.update_weights(eos_prone(tiny_state), 1)
    comps = [c for cs in engine.generate(PROMPTS, 4, [0, 1, 2]) for c in cs]
    stopped = [c for c in comps if c.finish_reason == "stop"]
    assert stopped, "with EOS this likely, some samples must stop"
    for c in comps:
        assert EOS not in c.token_ids[:-1]  # nothing is generated after EOS
        assert (c.token_ids[-1] == EOS) == (c.finish_reason == "stop")


def test_update_weights_changes_scores_to_those_of_the_new_weights(
    engine, tiny_path, tiny_state, fresh_weights
):
    seq = PROMPTS[0] + engine.generate([PROMPTS[0]], 1, [0])[0][0].token_ids
    before = engine.score([seq], len(PROMPTS[0]))[0]
    new = perturbed(tiny_state, seed=1)
    seconds = engine.update_weights(new, 5)
    after = engine.score([seq], len(PROMPTS[0]))[0]
    assert seconds >= 0 and engine.version == 5
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 1e-2
    assert after == pytest.approx(
        reference_logprobs(reference_model(tiny_path, new), seq, len(PROMPTS[0])), abs=1e-4
    )
    assert all(c.version == 5 for c in engine.generate([PROMPTS[0]], 2, [0])[0])


def test_score_equals_the_sampling_logprobs_at_temperature_one(engine):
    c = engine.generate([PROMPTS[2]], 1, [3])[0][0]
    assert engine.score([PROMPTS[2] + c.token_ids], [len(PROMPTS[2])])[0] == pytest.approx(
        c.logprobs, abs=1e-4
    )


def test_weights_of_another_model_are_refused(engine, tiny_state):
    bad = dict(tiny_state)
    bad["model.norm.weight"] = torch.ones(7)
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.update_weights(bad, 9)
    with pytest.raises(ValueError, match="missing"):
        engine.update_weights({"model.norm.weight": tiny_state["model.norm.weight"]}, 9)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_mask(scores, 0.7))[0].tolist()
    assert kept == [True, True, False, False]
    assert torch.isfinite(top_p_mask(scores, 0.01))[0].tolist() == [True, False, False, False]
