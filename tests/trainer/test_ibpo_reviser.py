"""The trainer's IBPO step without Ray: which responses are revised, with which references, how the results
become phi, advantages and masks (a scripted rollout pool and reward pool stand in for the actors)."""

from types import SimpleNamespace

import numpy as np
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


# -- multi-turn: a revision is a new trajectory in the job's environment --------------------------------------

QUESTION, ANSWER = "What is 6 * 7?", "42"


class CalculatorEngine:
    """Every trajectory calls the calculator first. After the tool's result, a training trajectory at an even
    position of its round answers with it, the one at position 1 one less, at 3 one more; a revision (its prompt
    holds the revision template) always answers with it. Records every request."""

    def __init__(self, tokenizer):
        self.tokenizer, self.version, self.requests = tokenizer, 0, []
        self.replica_spec = SimpleNamespace(
            sampling=SimpleNamespace(max_new_tokens=32)
        )  # the training default

    def generate(self, prompts, n, seeds, sampling=None):
        assert n == 1 and len(seeds) == len(prompts)
        out = []
        for j, ids in enumerate(prompts):
            text = self.tokenizer.decode(ids)
            self.requests.append((text, sampling))
            after = text.rsplit("<|im_start|>tool", 1)
            if len(after) == 1:  # no tool result yet: the first turn
                reply = "<calc>6 * 7</calc>"
            else:
                value = int(after[1].rsplit(" = ", 1)[1].split("<|im_end|>")[0])
                revising = "Here is an attempt at this task" in text
                off = 0 if revising or j % 2 == 0 else (-1 if j == 1 else 1)
                reply = f"The answer is {value + off}"
            ids = self.tokenizer.encode(reply, add_special_tokens=False)
            out.append([Completion(ids, [-0.25] * len(ids), "stop", self.version)])
        return out


def test_multi_turn_revisions_run_in_the_environment_and_credit_model_tokens_only():
    """A real calculator environment in the environment host's worker processes; only the engine is scripted.
    Trajectories 0 and 2 answer right, 1 and 3 wrong (41, 43) after the same tool call; 3 is marked failed (a deadline):
    it is neither revised nor centred. Trajectory 1's revision runs in the environment (tool call, result,
    answer), is scored by the environment's verifier, and its edit mask, aligned over model tokens, marks the
    last digit of the answer only: no observation token, none of the shared tool call."""
    from tgc_rl.reward.env_host import EnvHost
    from tgc_rl.tasks.grants import LOCAL_GRANTS
    from tgc_rl.trainer.loop import Trainer
    from tgc_rl.trainer.multi_turn import MultiTurnSampler

    env = {"name": "calculator", "bounds": {"max_total_tokens": 256, "max_observation_tokens": 32}}
    spec = tiny_spec(
        **{
            "env": env,
            "task": {"name": "arithmetic", "reward_workers": 1},
            "sampling.max_prompt_tokens": 256,
            "sampling.max_new_tokens": 32,
        },
        ibpo={"mask": "symmetric", "lambda_": 0.6},
    )
    assert spec.env is not None
    tok = load_tokenizer(spec.model)
    rev = Reviser(spec, tok, rlcore.get_objective(spec.objective.name))
    host = EnvHost(spec.task, spec.env, spec.seed, LOCAL_GRANTS)
    slots: list[list[int]] = []

    class Rewards:
        def env_call(self, env, calls):
            slots.append([c.slot for c in calls])
            return host.call(calls)

        def score(self, items, texts):
            raise AssertionError("a trajectory is scored by its environment")

    engine, rewards = CalculatorEngine(tok), Rewards()
    item = TaskItem(id="q-0", prompt=QUESTION, answer=ANSWER)
    try:
        sampler = MultiTurnSampler(spec.env, spec.seed, tok, engine, rewards)
        (mt,), _ = sampler.generate_groups([Prompt(0, item, tok.encode(QUESTION))], 4, 0)
        assert [s.reward for s in mt.scores] == [1.0, 0.0, 1.0, 0.0] and mt.keep == [True] * 4
        keep = [True, True, True, False]  # trajectory 3 failed: filtered before centring
        groups = [Group(mt.prompt, mt.completions, mt.scores, keep=keep)]
        metrics: dict[str, float] = {"timing/env_s": 1.0}
        rev.after_rollout(groups, engine, rewards, metrics)
    finally:
        host.close()

    revision_requests = [(t, s) for t, s in engine.requests if "Here is an attempt at this task" in t]
    assert len(revision_requests) == 2  # one trajectory, two turns: the tool call, then the answer
    first = revision_requests[0][0]
    assert "The answer is 41" in first and "The answer is 42" in first  # the attempt and its reference
    assert "6 * 7 = 42" in first  # a response is the whole trajectory: the tool's output too
    assert all(s.temperature == spec.sampling.temperature for _, s in revision_requests)
    assert slots[-2][0] == 0 and max(max(s) for s in slots) == 3  # no environment worker beyond the step's
    assert (
        metrics["ibpo/revisions"] == 1
        and metrics["ibpo/repaired"] == 1
        and metrics["ibpo/eligible_groups"] == 1
    )
    assert metrics["ibpo/revision_turns_mean"] == 2 and metrics["timing/env_s"] > 1.0
    assert metrics["ibpo/reward_errors"] == 0 and metrics["ibpo/skipped_too_long"] == 0
    rec = groups[0].credit
    assert rec.phi == [0.0, 0.5, 0.0, 0.0] and rec.attempted == [False, True, False, False]

    comp = mt.completions[1]
    model = np.asarray(comp.model_mask, dtype=bool)
    edits = rec.edits[1]
    assert edits.shape == (int(model.sum()),)  # one entry per model token
    ids = np.asarray(comp.token_ids)[model]
    assert tok.decode(ids[edits].tolist()) == "1"  # "41" -> "42": only the last digit was edited

    trainer = SimpleNamespace(credit=rev, tokenizer=tok)
    batch, m = Trainer.build_batch(trainer, groups)  # type: ignore[arg-type]
    credit = batch.credit
    assert credit is not None
    assert bool((credit[batch.response_mask == 0] == 0).all())  # no observation or template token has credit
    adv = batch.advantages
    assert adv[3] == 0 and abs(float(adv.sum())) < 1e-6  # failed: no credit; the group still sums to 0
    plain = rlcore.ibpo.shaped_advantages(
        rev.objective.config,
        batch.rewards,
        batch.group_ids,
        batch.response_mask,
        torch.zeros(4),
        0.6,
        torch.tensor(keep),
    )
    assert adv[0] == adv[2] > adv[1] > plain[1]  # the repair lifts trajectory 1, below its right siblings
    # naive: the repaired row keeps credit on its edited token only; symmetric: also on every node it shares with
    # a sibling that keeps it, the answer's opening after the tool's output included (nodes are found on the
    # history: on the loss mask they would stop at the first observation), so here on every model token
    model_cols = batch.response_mask[1].bool()
    naive = rlcore.ibpo.credit_mask(
        "naive", rec.edits, batch.response_ids, batch.response_mask, batch.group_ids, batch.history_mask
    )
    assert naive[1][model_cols].tolist() == [float(e) for e in edits.tolist()]
    assert bool((naive[batch.response_mask == 0] == 0).all())
    assert bool((credit[1][model_cols] == 1).all()) and m["ibpo/masked_token_frac"] == 0.0
    assert m["ibpo/preserves_cancellation"] == 1.0 and m["ibpo/d2_residual"] < 1e-9
    assert m["ibpo/naive/d2_residual"] > 1e-3  # the naive mask drops the shared tool call's negative copy
