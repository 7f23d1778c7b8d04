"""Token exactness: the trained sequence is what the engine was given and sampled, token for token."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.envs.scripted import ScriptedEnv, context, drive, run_of
from tgc_rl.envs import BridgeError, EnvBounds, Message, Sample, TrajectoryBuilder

IM_END = 2  # SmolLM2's <|im_end|>, its end-of-turn token
WORDS = ["the", " answer", " is", " 42", "\n", " tool", "(", ")", " x", "=", "1", " ok", "  ", "é", "```"]

# A Qwen3-style template: an assistant turn before the last user message loses its <think> block.
STRIP_THINKING = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- set c = m.content -%}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "<|im_start|>{{ m.role }}\n{{ c }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def _engine(tokenizer, seed: int, stop_every: int):
    """Samples random ordinary tokens; every `stop_every`-th turn is cut off (no <|im_end|>)."""
    rng = random.Random(seed)
    turn = [0]

    def sample(request):
        turn[0] += 1
        n = rng.randint(1, min(request.max_tokens, 24))
        ids = [rng.randint(300, 49000) for _ in range(n)]
        if turn[0] % stop_every and len(ids) < request.max_tokens:
            ids.append(IM_END)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return Sample(tuple(ids), tuple(-rng.random() for _ in ids), text)

    return sample


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.integers(1, 6),
    obs_words=st.lists(st.integers(0, 120), min_size=6, max_size=6),
    roles=st.lists(st.sampled_from(["tool", "user"]), min_size=6, max_size=6),
    seed=st.integers(0, 10**6),
    stop_every=st.integers(2, 5),
)
def test_trained_sequence_is_what_the_engine_was_given_and_sampled(
    template, tokenizer, turns, obs_words, roles, seed, stop_every
):
    rng = random.Random(seed)
    script = [
        (Message(roles[i], "".join(rng.choice(WORDS) for _ in range(obs_words[i]))),)
        for i in range(turns - 1)
    ]
    bounds = EnvBounds(max_turns=6, max_observation_tokens=64, max_total_tokens=4096)
    ctx = context(bounds)
    run = run_of(ScriptedEnv(ctx, script), ctx, template, max_new_tokens=32)
    log = drive(run, _engine(tokenizer, seed, stop_every))
    t = run.result()
    assert t.end_reason == "done" and t.turns == turns == len(log)
    model_positions = set()
    for request, sample in log:
        start = len(request.prompt_ids)
        # each prompt is the trajectory so far; each sample sits right after it, with its log-probs
        assert t.token_ids[:start] == request.prompt_ids
        assert t.token_ids[start : start + len(sample.token_ids)] == sample.token_ids
        assert t.logprobs[start : start + len(sample.token_ids)] == sample.logprobs
        model_positions.update(range(start, start + len(sample.token_ids)))
    last_request, last_sample = log[-1]
    assert t.token_ids == last_request.prompt_ids + last_sample.token_ids  # nothing after the last turn
    assert {i for i, m in enumerate(t.loss_mask) if m} == model_positions
    assert all(lp == 0.0 for i, lp in enumerate(t.logprobs) if i not in model_positions)
    assert t.model_tokens == sum(len(s.token_ids) for _, s in log)


def test_observation_is_the_templates_delta(template, tokenizer):
    b = TrajectoryBuilder(template)
    b.start([Message("user", "What is 2 + 3?")])
    sampled = tokenizer.encode("<calc>2+3</calc>", add_special_tokens=False) + [IM_END]
    b.add_model(sampled, [-0.5] * len(sampled), "<calc>2+3</calc>")
    b.add_observation([Message("tool", "5")])
    whole = template.render(
        [Message("user", "What is 2 + 3?"), Message("assistant", "<calc>2+3</calc>"), Message("tool", "5")],
        True,
    )
    assert b.token_ids == whole  # here the sample happens to be the canonical tokens: the same sequence
    assert (
        tokenizer.decode(b.token_ids[b.spans[2].start : b.spans[2].end])
        == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_cut_off_turn_gets_the_whole_close_as_context(template, tokenizer):
    b = TrajectoryBuilder(template)
    b.start([Message("user", "hi")])
    sampled = tokenizer.encode("Let me think", add_special_tokens=False)  # no <|im_end|>: cut at max_tokens
    b.add_model(sampled, [-1.0] * len(sampled), "Let me think")
    b.add_observation([Message("user", "go on")])
    inserted = b.token_ids[b.spans[1].end :]
    assert inserted[:2] == [IM_END, tokenizer.encode("\n", add_special_tokens=False)[0]]
    assert b.loss_mask[b.spans[1].end :] == [0] * len(inserted)


def test_model_tokens_are_never_re_encoded(template, tokenizer):
    """A sample whose tokens are not the canonical encoding of its text stays as sampled."""
    b = TrajectoryBuilder(template)
    b.start([Message("user", "hi")])
    odd = [tokenizer.convert_tokens_to_ids(c) for c in ("a", "b", "c")] + [
        IM_END
    ]  # canonical 'abc' is 1 token
    assert tokenizer.encode("abc", add_special_tokens=False) != odd[:3]
    b.add_model(odd, [-0.1] * 4, "abc")
    b.add_observation([Message("tool", "ok")])
    s = b.spans[1]
    assert b.token_ids[s.start : s.end] == odd and b.loss_mask[s.start : s.end] == [1] * 4


def test_a_template_that_strips_earlier_reasoning_fails_closed(tokenizer):
    from tgc_rl.envs import ChatTemplate

    template = ChatTemplate(tokenizer, STRIP_THINKING)
    text = "<think>2+3 is 5</think>5"
    ids = tokenizer.encode(text, add_special_tokens=False) + [IM_END]
    b = TrajectoryBuilder(template)
    b.start([Message("user", "What is 2 + 3?")])
    b.add_model(ids, [-0.1] * len(ids), text)
    b.observation_delta([Message("tool", "ok")])  # a tool turn keeps the reasoning: extends exactly
    with pytest.raises(BridgeError, match="does not extend"):
        b.observation_delta([Message("user", "Are you sure?")])  # a new user turn strips it


def test_the_bridge_failure_ends_the_run_with_its_reason(tokenizer):
    from tgc_rl.envs import ChatTemplate

    ctx = context()
    env = ScriptedEnv(ctx, [(Message("user", "Are you sure?"),)])
    run = run_of(env, ctx, ChatTemplate(tokenizer, STRIP_THINKING))
    text = "<think>hm</think>5"
    ids = tuple(tokenizer.encode(text, add_special_tokens=False) + [IM_END])
    drive(run, lambda r: Sample(ids, tuple([-0.1] * len(ids)), text))
    t = run.result()
    assert (t.end_reason, t.turns, env.closed) == ("bridge", 1, 1)
    assert "does not extend" in t.detail


def test_a_trajectory_is_the_learners_response_after_its_prompt(template, tokenizer):
    script = [(Message("tool", "x = 1"),), (Message("user", "and?"),)]
    ctx = context()
    run = run_of(ScriptedEnv(ctx, script), ctx, template)
    log = drive(run, _engine(tokenizer, seed=3, stop_every=2))
    t = run.result()
    c = t.completion(version=7)
    assert t.token_ids[: t.prompt_len] == log[0][0].prompt_ids
    assert tuple(c.token_ids) == t.token_ids[t.prompt_len :]
    assert c.model_mask == [bool(m) for m in t.loss_mask[t.prompt_len :]]
    assert tuple(c.logprobs) == t.logprobs[t.prompt_len :]
    assert (c.finish_reason, c.version) == ("done", 7)
