"""The vLLM engine (CPU backend here), driven directly: one engine for the whole module (start-up is slow)."""

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
from tgc_rl.weight_sync.flat import FlatWeights

pytestmark = pytest.mark.slow
pytest.importorskip("vllm")

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def engine(tiny_path):
    import rlcore.diagnostics  # noqa: F401  loads numba/llvmlite first, as any learner-side import does
    from tgc_rl.rollout.vllm_engine import VLLMEngine

    torch.set_num_threads(1)
    eng = VLLMEngine(replica_spec("vllm", temperature=TEMPERATURE, max_prompt_tokens=160), tiny_path)
    yield eng
    eng.close()


@pytest.fixture
def fresh_weights(engine, tiny_state):
    yield
    engine.update_weights(tiny_state, 0)


def test_generate_returns_n_completions_per_prompt_with_aligned_logprobs(engine):
    out = engine.generate(PROMPTS, 4, [0, 1, 2])
    assert [len(cs) for cs in out] == [4, 4, 4]
    for cs in out:
        assert len({tuple(c.token_ids) for c in cs}) == 4
        for c in cs:
            assert len(c.token_ids) == 12 and len(c.logprobs) == 12 and c.finish_reason == "length"
            assert all(lp <= 0.0 for lp in c.logprobs) and c.version == 0


def test_a_batch_larger_than_one_scheduler_step_generates(engine):
    # 40 x 120 prompt tokens > the 4096-token step budget: with chunked prefill, vLLM would split a seeded
    # prompt across steps and fail rewinding its CPU generator
    long_prompt = (PROMPTS[2] * 20)[:120]
    out = engine.generate([long_prompt] * 10, 4, list(range(10)))
    assert [len(cs) for cs in out] == [4] * 10 and all(c.token_ids for cs in out for c in cs)


def test_same_seeds_give_the_same_samples(engine):
    first = engine.generate(PROMPTS, 3, [4, 5, 6])
    again = engine.generate(PROMPTS, 3, [4, 5, 6])
    other = engine.generate(PROMPTS, 3, [7, 8, 9])
    ids = lambda out: [[c.token_ids for c in cs] for cs in out]  # noqa: E731
    assert ids(first) == ids(again)
    assert ids(first) != ids(other)


def test_sampling_logprobs_are_the_tempered_distribution(engine, tiny_path):
    ref_model = reference_model(tiny_path)
    for p, c in zip(PROMPTS, [cs[0] for cs in engine.generate(PROMPTS, 1, [0, 1, 2])], strict=True):
        ref = reference_logprobs(ref_model, p + c.token_ids, len(p), temperature=TEMPERATURE)
        assert c.logprobs == pytest.approx(ref, abs=1e-3)


def test_generation_stops_at_eos_and_keeps_it(engine, tiny_state, fresh_weights):
    engine.update_weights(eos_prone(tiny_state), 1)
    comps = [c for cs in engine.generate(PROMPTS, 4, [0, 1, 2]) for c in cs]
    assert any(c.finish_reason == "stop" for c in comps)
    for c in comps:
        assert EOS not in c.token_ids[:-1]
        assert (c.token_ids[-1] == EOS) == (c.finish_reason == "stop")


def test_update_weights_changes_scores_to_those_of_the_new_weights(
    engine, tiny_path, tiny_state, fresh_weights
):
    seq = PROMPTS[0] + engine.generate([PROMPTS[0]], 1, [0])[0][0].token_ids
    before = engine.score([seq], len(PROMPTS[0]))[0]
    assert before == pytest.approx(
        reference_logprobs(reference_model(tiny_path), seq, len(PROMPTS[0])), abs=1e-4
    )
    new = perturbed(tiny_state, seed=1)
    seconds = engine.update_weights(new, 3)
    after = engine.score([seq], len(PROMPTS[0]))[0]
    assert seconds > 0 and engine.version == 3
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 1e-2
    assert after == pytest.approx(
        reference_logprobs(reference_model(tiny_path, new), seq, len(PROMPTS[0])), abs=1e-4
    )
    assert {c.version for c in engine.generate([PROMPTS[1]], 2, [0])[0]} == {3}


def test_flat_object_store_weights_load_like_a_state_dict(engine, tiny_path, tiny_state, fresh_weights):
    new = perturbed(tiny_state, seed=2)
    flat = FlatWeights.from_state_dict(new)
    flat.buffer.setflags(write=False)  # read-only, as ray.get maps it from the object store
    engine.update_weights(flat, 4)
    seq = PROMPTS[2] + [300, 301, 302, 303]
    assert engine.score([seq], len(PROMPTS[2]))[0] == pytest.approx(
        reference_logprobs(reference_model(tiny_path, new), seq, len(PROMPTS[2])), abs=1e-4
    )


def test_new_weights_are_not_served_from_the_prefix_cache(engine, tiny_path, tiny_state, fresh_weights):
    # longer than one 128-token KV block, so the second request finds the prompt's first block cached
    prompt = (PROMPTS[0] * 20)[:140]
    engine.generate([prompt], 1, [0])
    new = perturbed(tiny_state, seed=3)
    engine.update_weights(new, 5)
    c = engine.generate([prompt], 1, [0])[0][0]
    ref = reference_logprobs(reference_model(tiny_path, new), prompt + c.token_ids, len(prompt), TEMPERATURE)
    assert c.logprobs == pytest.approx(ref, abs=1e-3)


def test_too_long_sequence_is_refused_before_reaching_vllm(engine):
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        engine.score([[1] * 200], 3)


def test_after_close_a_fresh_engine_starts_and_reproduces_the_samples(engine, tiny_path):
    """What exact resume needs: same weights and seeds in a new engine give the same tokens."""
    import torch.distributed as dist

    from tgc_rl.rollout.vllm_engine import VLLMEngine

    expected = engine.generate(PROMPTS, 3, [21, 22, 23])  # weights: synced back to the initial ones
    engine.close()
    assert not dist.is_initialized()  # a learner rank in this process could init its own group
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2  # vLLM's process-wide no-op patch is undone
    torch.set_num_threads(1)
    fresh = VLLMEngine(engine.spec, tiny_path)
    try:
        got = fresh.generate(PROMPTS, 3, [21, 22, 23])
    finally:
        fresh.close()
    assert [[c.token_ids for c in cs] for cs in got] == [[c.token_ids for c in cs] for cs in expected]
