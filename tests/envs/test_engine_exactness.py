"""Token exactness against a real engine: a tiny random model samples every turn (HFEngine), and the model
re-scoring the finished trajectory at its model tokens gives back the engine's sampling log-probs, which
it can only do if every model token sits where, and after what, it was sampled."""

import pytest
import torch

from tests.envs.scripted import ScriptedEnv, context, drive, run_of
from tests.rollout.rollout_helpers import replica_spec
from tgc_rl.envs import EnvBounds, Message, Sample
from tgc_rl.models import model_dir
from tgc_rl.rollout.engine import Sampling
from tgc_rl.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(1)
    spec = replica_spec("hf", max_prompt_tokens=1024, max_new_tokens=16)
    eng = HFEngine(spec, model_dir(spec.model, 0))
    yield eng
    eng.close()


def test_rescoring_the_trajectory_gives_the_engines_log_probs_back(engine, template, tokenizer):
    observations = [(Message("tool", "x = 41 + 1\n42"),), (Message("user", "Are you sure? " * 5),)]
    ctx = context(EnvBounds(max_turns=3, max_total_tokens=1024))
    run = run_of(ScriptedEnv(ctx, observations), ctx, template, max_new_tokens=16)
    seeds = iter(range(100))

    def sample(request):
        sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=request.max_tokens)
        (c,) = engine.generate([list(request.prompt_ids)], 1, [next(seeds)], sampling)[0]
        return Sample(
            tuple(c.token_ids), tuple(c.logprobs), tokenizer.decode(c.token_ids, skip_special_tokens=True)
        )

    log = drive(run, sample)
    t = run.result()
    assert t.end_reason == "done" and t.turns == 3 == len(log)
    rescored = engine.score([list(t.token_ids)], t.prompt_len)[0]
    after = range(t.prompt_len, len(t.token_ids))
    model = [rescored[i - t.prompt_len] for i in after if t.loss_mask[i]]
    sampled = [t.logprobs[i] for i in after if t.loss_mask[i]]
    assert len(model) == sum(len(s.token_ids) for _, s in log)
    assert model == pytest.approx(sampled, abs=1e-4)
