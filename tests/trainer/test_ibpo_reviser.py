"""The trainer's IBPO step without Ray: which responses are revised, with which references, how the results
become phi, advantages and masks (a scripted rollout pool and reward pool stand in for the actors)."""

import torch

import rlcore
from tgc_rl.batch import Completion, collate
from tgc_rl.models import load_tokenizer
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.trainer.data import Prompt
from tgc_rl.trainer.ibpo import Reviser
from tgc_rl.trainer.loop import Group

from .conftest import tiny_spec


class ScriptedRollout:
    """Answers every revision prompt with `answer(prompt_text)` (token ids), recording the calls."""

    def __init__(self, tokenizer, answer):
        self.tokenizer, self.answer, self.calls = tokenizer, answer, []

    def generate(self, prompts, n, seeds, sampling=None):
        self.calls.append((prompts, n, seeds, sampling))
        texts = [self.tokenizer.decode(p) for p in prompts]
        return [[Completion(self.answer(t), [0.0] * len(self.answer(t)), "stop", 0)] for t in texts]


class ParityRewards:
    def score(self, items, texts):
        return [Score(float(len(t) % 2 == 0)) for t in texts]


def _setup(mask="symmetric", **changes):
    spec = tiny_spec(**{"ibpo": {"mask": mask, "lambda_": 0.6}, "sampling.max_prompt_tokens": 256, **changes})
    tok = load_tokenizer(spec.model)
    return spec, tok, Reviser(spec, tok, rlcore.get_objective(spec.objective.name))


def _group(tok, index, responses, rewards):
    item = TaskItem(id=f"t-{index}", prompt=f"What is {index} + 1?")
    comps = [Completion(tok.encode(r), [-0.5] * len(tok.encode(r)), "stop", 0) for r in responses]
    return Group(Prompt(index, item, tok.encode(item.prompt)), comps, [Score(x) for x in rewards])


def test_only_incorrect_responses_with_a_correct_sibling_are_revised():
    spec, tok, rev = _setup()
    groups = [
        _group(tok, 0, ["1", "2", "3", "4"], [1.0, 0.0, 0.0, 1.0]),
        _group(tok, 1, ["5", "6", "7", "8"], [0.0, 0.0, 0.0, 0.0]),  # no correct sibling
        _group(tok, 2, ["9", "10", "11", "12"], [1.0, 1.0, 1.0, 1.0]),
    ]  # nothing to repair
    # every revision answers "7 and 80": even length for the verifier -> repaired
    rollout = ScriptedRollout(tok, lambda text: tok.encode("7 and 80"))
    metrics = {"timing/generate_s": 1.0, "timing/reward_s": 0.5}
    rev.after_rollout(groups, rollout, ParityRewards(), metrics)
    ((prompts, n, seeds, sampling),) = rollout.calls  # one batched pass
    assert len(prompts) == 2 and n == 1 and len(set(seeds)) == 2
    assert (
        sampling.temperature == spec.sampling.temperature
        and sampling.max_new_tokens == spec.sampling.max_new_tokens
    )
    texts = [tok.decode(p) for p in prompts]
    # the rotation: response 1 sees sibling 3, response 2 sees sibling 0
    assert (
        "What is 0 + 1?" in texts[0] and "attempt at this task:\n2" in texts[0] and "solution:\n4" in texts[0]
    )
    assert "attempt at this task:\n3" in texts[1] and "solution:\n1" in texts[1]
    assert groups[0].credit.phi == [0.0, 0.5, 0.5, 0.0] and groups[1].credit.phi == [0.0] * 4
    assert groups[0].credit.attempted == [False, True, True, False]
    assert (
        metrics["ibpo/revisions"] == 2
        and metrics["ibpo/repaired"] == 2
        and metrics["ibpo/success_rate"] == 1.0
    )
    assert metrics["ibpo/eligible_groups"] == 1 and metrics["timing/generate_s"] >= 1.0
    assert metrics["ibpo/tokens"] == 2 * len(tok.encode("7 and 80"))

    batch = _batch(tok, groups)
    trained, m = rev.train_batch(groups, batch)
    adv = trained.loss_advantages
    assert adv.shape == batch.response_mask.shape  # a mask makes per-token advantages
    seq = rlcore.ibpo.shaped_advantages(
        rev.objective.config,
        batch.rewards,
        batch.group_ids,
        batch.response_mask,
        torch.tensor([p for g in groups for p in g.credit.phi]),
        0.6,
    )
    assert torch.allclose(adv[0], seq[0] * batch.response_mask[0])  # a correct response keeps every token
    assert m["ibpo/preserves_cancellation"] == 1.0 and m["ibpo/d2_residual"] < 1e-9


def test_too_long_revision_prompts_are_skipped_and_counted():
    spec, tok, rev = _setup(**{"sampling.max_prompt_tokens": 64})
    groups = [_group(tok, 0, ["1", "word " * 40, "3", "4"], [1.0, 0.0, 1.0, 1.0])]
    rollout = ScriptedRollout(tok, lambda text: tok.encode("x"))
    metrics: dict[str, float] = {}
    rev.after_rollout(groups, rollout, ParityRewards(), metrics)
    assert metrics["ibpo/skipped_too_long"] == 1 and metrics["ibpo/revisions"] == 0 and rollout.calls == []
    assert groups[0].credit.phi == [0.0] * 4


def test_no_mask_gives_sequence_advantages_with_zero_group_sums():
    spec, tok, rev = _setup(mask="none")
    groups = [_group(tok, 0, ["1", "2", "3", "4"], [1.0, 0.0, 0.0, 0.0])]
    rev.after_rollout(groups, ScriptedRollout(tok, lambda text: tok.encode("ab")), ParityRewards(), {})
    trained, m = rev.train_batch(groups, _batch(tok, groups))
    adv = trained.loss_advantages
    assert adv.shape == (4,) and abs(float(adv.sum())) < 1e-6
    assert adv[0] > adv[1] == adv[2] == adv[3]  # all three repaired: shaped up together, still below correct
    assert "ibpo/naive/d2_residual" not in m and m["ibpo/masked_token_frac"] == 0.0


def _batch(tok, groups):
    prompts, comps, gids, rewards = [], [], [], []
    for gi, g in enumerate(groups):
        for c, s in zip(g.completions, g.scores, strict=True):
            prompts.append(g.prompt.token_ids)
            comps.append(c)
            gids.append(gi)
            rewards.append(s.reward)
    r = torch.tensor(rewards)
    return collate(prompts, comps, gids, r, tok.pad_token_id)
