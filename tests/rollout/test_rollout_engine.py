"""The engine-independent parts: per-sample seeds, request checks, and which engine a spec selects."""

import pytest

from tests.rollout.rollout_helpers import replica_spec
from tgc_rl.rollout.engine import check_requests, engine_kind, prompt_lengths, sample_seed, vllm_available


def test_sample_seeds_are_distinct_across_prompts_and_samples():
    seeds = {sample_seed(s, j) for s in range(50) for j in range(16)}
    assert len(seeds) == 50 * 16  # vLLM's own seed+j scheme would collide: (1, 1) == (2, 0)
    assert all(0 <= s < 2**63 for s in seeds)


def test_sample_seed_is_a_pure_function_of_seed_and_index():
    assert sample_seed(123, 4) == sample_seed(123, 4)
    assert sample_seed(123, 4) != sample_seed(124, 4)


def test_too_long_prompt_names_the_field_to_change():
    with pytest.raises(ValueError, match="sampling.max_prompt_tokens"):
        check_requests([[1] * 40], 2, [0], max_prompt_tokens=32)


def test_one_seed_per_prompt_is_required():
    with pytest.raises(ValueError, match="one seed per prompt"):
        check_requests([[1, 2], [3]], 2, [0], max_prompt_tokens=32)


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        check_requests([[1, 2], []], 2, [0, 1], max_prompt_tokens=32)


def test_prompt_of_non_token_ids_is_refused():
    with pytest.raises(ValueError, match="list of token ids"):
        check_requests([["input_ids", "attention_mask"]], 1, [0], max_prompt_tokens=32)


def test_prompt_length_outside_the_sequence_is_refused():
    with pytest.raises(ValueError, match=r"must be in \[1, 3\]"):
        prompt_lengths([[1, 2, 3]], 4)
    assert prompt_lengths([[1, 2, 3], [4, 5]], [1, 2]) == [1, 2]


def test_engine_choice_follows_the_spec():
    assert engine_kind(replica_spec("hf")) == "hf"
    assert engine_kind(replica_spec("auto")) == ("vllm" if vllm_available() else "hf")
