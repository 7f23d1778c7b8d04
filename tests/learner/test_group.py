"""LearnerGroup: 2 FSDP2 ranks as Ray actors (gloo) reproduce the single-process learner exactly."""

import os
import time

import pytest
import torch

from tests.learner.test_prefix_tree import multi_turn
from tgc_rl.learner import Learner, LearnerGroup, LearnerGroupError, LearnerSpec
from tgc_rl.resources import ResourceError

pytestmark = pytest.mark.slow


def _pair(spec_fn, model_path, objective, job):
    """A 2-rank group (1 group per micro-batch) and a 1-rank learner (one micro-batch) fed the same calls."""
    group = LearnerGroup(
        spec_fn(
            **{
                "objective.name": objective,
                "resources.learner_ranks": 2,
                "resources.cpus_per_learner": 0.5,
                "optim.micro_batch_size": 4,
            }
        ),
        model_path,
        job,
    )
    single = Learner(
        LearnerSpec.of(spec_fn(**{"objective.name": objective, "optim.micro_batch_size": 64})), model_path
    )
    return group, single


@pytest.fixture(scope="module")
def cp_pair(ray_cluster, tiny_spec, tiny_model_path):
    torch.set_num_threads(1)
    group, single = _pair(tiny_spec, tiny_model_path, "cp_grpo", "test-cp")
    yield group, single
    group.shutdown()


def _assert_same_gradients(group, single, batch):
    g2, g1 = group.gradients(batch), single.gradients(batch)
    assert g1.keys() == g2.keys()
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], rtol=1e-4, atol=1e-7)


def test_two_ranks_reproduce_the_token_mean_gradient(cp_pair, make_batch):
    # 5 groups over 2 ranks: one rank also runs a zero-weight padding pass
    _assert_same_gradients(*cp_pair, make_batch(n_groups=5, objective="cp_grpo"))


def test_two_ranks_reproduce_the_per_sequence_gradient_and_a_dead_rank_stops_the_group_cleanly(
    ray_cluster, tiny_spec, tiny_model_path, make_batch
):
    """One 2-rank group start for both: the per-sequence (grpo) gradient, then a rank killed under it."""
    group, single = _pair(tiny_spec, tiny_model_path, "grpo", "test-grpo")
    try:
        _assert_same_gradients(group, single, make_batch(n_groups=5, objective="grpo"))
        ray_cluster.kill(group.actors[1])
        with pytest.raises(LearnerGroupError, match="learner rank failed"):
            group.train_step(make_batch(objective="grpo"))
        assert group.actors == []
        with pytest.raises(LearnerGroupError, match="shut down"):
            group.train_step(make_batch(objective="grpo"))
    finally:
        group.shutdown()


@pytest.mark.parametrize("turns", ["single", "multi"])
def test_two_ranks_with_shared_prompts_reproduce_the_full_forward_gradient(
    cp_pair, tiny_spec, tiny_model_path, make_batch, turns
):
    """The group computes each prompt once per micro-batch (the default): 3 + 2 micro-batches and a padding
    pass over 2 ranks give the gradient of one full forward per row in one process; multi: ragged
    multi-turn trajectories whose loss masks have holes (tool output shared through a deterministic tool)."""
    group, _ = cp_pair
    full = Learner(
        LearnerSpec.of(
            tiny_spec(
                **{
                    "objective.name": "cp_grpo",
                    "optim.micro_batch_size": 64,
                    "optim.shared_prompt_forward": False,
                }
            )
        ),
        tiny_model_path,
    )
    assert not full.policy.prefix_tree
    batch = (
        make_batch(n_groups=5, seed=3, objective="cp_grpo")
        if turns == "single"
        else multi_turn(3, n_groups=5)
    )
    _assert_same_gradients(group, full, batch)


def test_two_ranks_take_the_same_optimizer_step(cp_pair, make_batch):
    group, single = cp_pair
    batch = make_batch(n_groups=5, seed=7)
    m2, m1 = group.train_step(batch), single.train_step(batch)
    assert (m2["loss"], m2["grad_norm"], m2["entropy"]) == pytest.approx(
        (m1["loss"], m1["grad_norm"], m1["entropy"]), rel=1e-5
    )
    assert m2["tokens"] == m1["tokens"] and m2["optimizer_steps"] == m1["optimizer_steps"]
    torch.testing.assert_close(group.logprobs(batch), single.logprobs(batch), rtol=1e-5, atol=1e-5)


def test_published_weights_are_the_full_state_dict(cp_pair, ray_cluster):
    group, single = cp_pair
    ref = group.publish_weights()
    assert isinstance(ref, ray_cluster.ObjectRef)
    published, local = ray_cluster.get(ref), single.full_state_dict()
    assert published.keys() == local.keys() and "model.embed_tokens.weight" in published
    for name in local:
        # atol well below one AdamW step (lr 1e-3); Adam amplifies fp noise in near-zero gradients
        torch.testing.assert_close(published[name], local[name], rtol=0, atol=2e-4)


def test_checkpoint_restores_the_group_and_loads_in_one_rank(
    cp_pair, tiny_spec, tiny_model_path, make_batch, tmp_path
):
    group, single = cp_pair
    batch = make_batch(n_groups=5, seed=11)
    group.save(tmp_path / "ck")
    saved = group.logprobs(batch)
    group.train_step(batch)
    group.load(tmp_path / "ck")
    torch.testing.assert_close(group.logprobs(batch), saved, rtol=0, atol=0)
    # The sharded training state of 2 ranks reshards into a single rank that continues identically.
    resumed = Learner(
        LearnerSpec.of(tiny_spec(**{"objective.name": "cp_grpo", "optim.micro_batch_size": 64})),
        tiny_model_path,
    )
    resumed.load(tmp_path / "ck")
    torch.testing.assert_close(resumed.logprobs(batch), saved, rtol=1e-6, atol=1e-5)
    assert resumed.train_step(batch)["loss"] == pytest.approx(group.train_step(batch)["loss"], rel=1e-5)
    assert (tmp_path / "ck" / "model" / "config.json").exists()


def test_a_group_the_cluster_cannot_place_is_refused(ray_cluster, tiny_spec, tiny_model_path):
    with pytest.raises(ResourceError, match="resources: 64 learner ranks"):
        LearnerGroup(tiny_spec(**{"resources.learner_ranks": 64}), tiny_model_path, "test-too-big")


def test_shutdown_leaves_no_actor_or_process_behind(cp_pair, ray_cluster):
    """The module's cp group, shut down last (its fixture's own shutdown afterwards finds nothing to do)."""
    group, _ = cp_pair
    names = [f"test-cp-learner-{r}" for r in range(2)]
    pids = [
        ray_cluster.get(ray_cluster.get_actor(n).__ray_call__.remote(lambda self: os.getpid())) for n in names
    ]
    group.shutdown()
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
    for name in names:  # a dead actor's name is released
        with pytest.raises(ValueError, match="Failed to look up actor"):
            ray_cluster.get_actor(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
