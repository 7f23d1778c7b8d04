"""Testbed 2's synthetic task, policy and exact measurements."""

import numpy as np
import pytest
import torch

from experiments.tinylm.measures import Probe
from experiments.tinylm.model import ModelConfig, TinyLM
from experiments.tinylm.policy import sample, token_logprobs
from experiments.tinylm.task import ANSWER, EOS, FIRST_PROMPT, PAD, PROMPT_LEN, SyntheticTask, TaskConfig


@pytest.fixture(scope="module")
def task():
    return SyntheticTask()


@pytest.fixture(scope="module")
def model(task):
    torch.manual_seed(0)
    return TinyLM(ModelConfig(task.vocab_size, task.seq_len, d_model=32, n_heads=2)).eval()


def test_sampled_responses_follow_the_grammar(task, model):
    ro = sample(model, task, torch.arange(8), 4, torch.Generator().manual_seed(0))
    resp = ro.responses
    for j in range(resp.shape[1]):
        active = resp[:, j] != PAD
        assert bool(task.allowed[j][resp[active, j]].all())
    ends = (resp == EOS).float().argmax(1)
    assert bool(((resp == EOS).sum(1) == 1).all())
    assert torch.equal(ro.lengths, (ends + 1).float())


def test_old_logprobs_are_those_of_a_fresh_forward(task, model):
    ro = sample(model, task, torch.arange(4), 4, torch.Generator().manual_seed(1))
    lp, _ = token_logprobs(model, task, ro.tokens)
    assert torch.allclose(lp * ro.mask, ro.logprobs, atol=1e-6)


def test_reward_is_one_exactly_for_the_prompt_correct_answers(task):
    pid = torch.tensor([3, 3, 3])
    c0, c1 = task.correct[3]
    wrong = next(a for a in range(len(ANSWER)) if a not in (c0, c1))
    answers = torch.tensor([ANSWER[c0], ANSWER[c1], ANSWER[wrong]])
    assert task.is_correct(pid, answers).tolist() == [1.0, 1.0, 0.0]


def test_base_targets_are_distributions_and_sampled_tokens_have_mass(task):
    tok, tgt = task.sample_base(64, np.random.default_rng(0))
    mass = tgt.sum(-1)
    modelled = mass > 0
    assert torch.allclose(mass[modelled], torch.ones_like(mass[modelled]), atol=1e-5)
    nxt = tok[:, 1:]
    picked = tgt.gather(-1, nxt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert bool((picked[modelled] > 0).all())


def test_wrong_answers_ramble_in_the_base_distribution(task):
    tok, _ = task.sample_base(2000, np.random.default_rng(1))
    length = (tok[:, PROMPT_LEN:] != PAD).sum(1).float()
    ok = task.is_correct(tok[:, 1] - FIRST_PROMPT, tok[:, PROMPT_LEN + 2])
    assert length[ok == 0].mean() > length[ok == 1].mean() + 3


def test_exact_accuracy_matches_monte_carlo(task, model):
    probe = Probe(task, model, task.sample_probes(8, np.random.default_rng(2))[0])
    exact = probe.measure(model)["eval/accuracy"]
    ro = sample(model, task, torch.arange(task.cfg.n_prompts).repeat(8), 8, torch.Generator().manual_seed(3))
    mc, se = ro.rewards.mean().item(), ro.rewards.std().item() / ro.rewards.numel() ** 0.5
    assert abs(mc - exact) < 4 * se


def test_probe_drift_is_zero_for_the_initial_model(task, model):
    probe = Probe(task, model, task.sample_probes(8, np.random.default_rng(2))[0])
    m = probe.measure(model)
    assert m["probe/kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["eval/equiv_drift"] == pytest.approx(0.0, abs=1e-5)


def test_task_config_rejects_bad_probabilities():
    with pytest.raises(ValueError, match="p_template"):
        TaskConfig(p_template=1.5)
