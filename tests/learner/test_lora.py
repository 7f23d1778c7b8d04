"""A LoRA learner (one FSDP2 rank, gloo) on the tiny random Llama: what trains, the reference, checkpoints, and the
weight sync's canary against a real engine that does or does not load what it is sent."""

import pytest
import torch

from tests.learner.test_learner import _unsharded_logprobs
from tgc_rl.learner import Learner
from tgc_rl.weight_sync.flat import weights_nbytes
from tgc_rl.weight_sync.sync import SyncCanaryError, WeightSync

pytestmark = pytest.mark.slow

LORA = {"model.lora": {"rank": 4, "alpha": 8}, "optim.lr": 2e-2}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI machine has 2 cores shared by everything
    yield
    torch.set_num_threads(threads)


def test_the_optimizer_holds_only_the_adapters_and_the_base_stays_frozen(
    learner_spec, tiny_model_path, make_batch
):
    learner = Learner(learner_spec(**LORA), tiny_model_path)
    held = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    names = {n for n, p in learner.policy.lm.named_parameters() if id(p) in held}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    # 2 layers x 7 linears, A and B each
    assert len(names) == 28
    base = {n: p.detach().clone() for n, p in learner.policy.lm.named_parameters() if id(p) not in held}
    batch = make_batch()
    before = learner.logprobs(batch)
    learner.train_step(batch)
    assert float((learner.logprobs(batch) - before).abs().max()) > 1e-3  # the adapters moved the policy
    for n, p in learner.policy.lm.named_parameters():
        if n in base:
            assert torch.equal(p.detach(), base[n]), n


def test_the_kl_reference_is_the_base_model_with_the_adapters_off(learner_spec, tiny_model_path, make_batch):
    learner = Learner(learner_spec(**LORA, **{"objective.overrides": {"kl_coef": 0.1}}), tiny_model_path)
    assert learner.reference is None  # no second copy of the model
    batch = make_batch()
    assert learner.train_step(batch)["objective/loss/kl"] == pytest.approx(0.0, abs=1e-6)
    assert learner.train_step(batch)["objective/loss/kl"] > 1e-6
    torch.testing.assert_close(
        learner._reference_logprobs(batch), _unsharded_logprobs(tiny_model_path, batch), rtol=1e-5, atol=1e-5
    )


def test_lora_save_then_load_continues_identically_and_the_merged_model_serves_the_policy(
    learner_spec, tiny_model_path, make_batch, tmp_path
):
    spec = learner_spec(**{**LORA, "model.lora": {"rank": 4, "alpha": 8, "save_merged": True}, "steps": 4})
    batches = [make_batch(seed=s) for s in range(3)]
    first = Learner(spec, tiny_model_path)
    first.train_step(batches[0])
    first.save(tmp_path / "ck")
    expected = [first.train_step(b) for b in batches[1:]]
    resumed = Learner(spec, tiny_model_path)
    resumed.load(tmp_path / "ck")
    got = [resumed.train_step(b) for b in batches[1:]]
    for e, g in zip(expected, got, strict=True):
        assert (g["loss"], g["grad_norm"], g["lr"]) == pytest.approx(
            (e["loss"], e["grad_norm"], e["lr"]), rel=1e-6
        )
    torch.testing.assert_close(resumed.logprobs(batches[0]), first.logprobs(batches[0]), rtol=0, atol=1e-6)
    # the learner state holds the adapters and their moments only: the base is the model directory's
    state_bytes = sum(f.stat().st_size for f in (tmp_path / "ck" / "learner").rglob("*.distcp"))
    base_bytes = sum(f.stat().st_size for f in tiny_model_path.glob("*.safetensors"))
    assert state_bytes < 0.05 * base_bytes, (state_bytes, base_bytes)
    # merged weights (save_merged) load in plain transformers as the step-1 policy
    step1 = Learner(spec, tiny_model_path)
    step1.load(tmp_path / "ck")
    torch.testing.assert_close(
        _unsharded_logprobs(tmp_path / "ck" / "model", batches[0]),
        step1.logprobs(batches[0]),
        rtol=1e-5,
        atol=1e-5,
    )


class _Rank:
    """The calls WeightSync makes of a LearnerGroup, answered by one in-process rank (no Ray)."""

    def __init__(self, learner: Learner):
        self.learner = learner

    def publish_weights(self, pack=None, adapter=False):
        state = self.learner.adapter_state_dict() if adapter else self.learner.full_state_dict()
        return pack(state) if pack is not None else state

    def canary_logprobs(self, sequence, prompt_len):
        return self.learner.canary_logprobs(sequence, prompt_len)


class _Replica:
    """The calls WeightSync makes of a RolloutPool, on one real engine; `drop` loses every sync on the way."""

    kind, restarts = "hf", 0

    def __init__(self, engine, drop: bool):
        self.engine, self.drop = engine, drop

    def update_weights(self, weights, version):
        if not self.drop:
            self.engine.update_weights(weights, version)
        return {"sync_s": 0.0, "bytes": float(weights_nbytes(weights))}

    def score(self, sequences, prompt_len):
        return self.engine.score(sequences, prompt_len)


@pytest.mark.parametrize("drop", [False, True])
def test_the_canary_passes_a_sync_that_reached_the_engine_and_fails_one_that_did_not(
    tiny_spec, tiny_model_path, make_batch, drop
):
    from tgc_rl.learner import LearnerSpec
    from tgc_rl.rollout.hf_engine import HFEngine
    from tgc_rl.rollout.spec import RolloutSpec

    spec = tiny_spec(**{**LORA, "model.lora": {"rank": 4, "alpha": 8, "canary_tolerance": 1e-3}})
    learner = Learner(LearnerSpec.of(spec), tiny_model_path)
    sync = WeightSync(spec, _Rank(learner), _Replica(HFEngine(RolloutSpec.of(spec), tiny_model_path), drop))
    assert not sync.adapter  # the transformers engine gets merged weights
    assert sync(0)["canary_logprob_diff"] < 1e-5  # nothing trained yet: base == policy either way
    learner.train_step(make_batch())
    if drop:
        with pytest.raises(SyncCanaryError, match=r"version 1 .* did not reach the rollout engine"):
            sync(1)
    else:
        assert sync(1)["canary_logprob_diff"] < 1e-4
