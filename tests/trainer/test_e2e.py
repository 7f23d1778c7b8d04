"""The whole job on a real local Ray cluster: rollout actors, reward pool, FSDP2 learner ranks, weight sync,
checkpoints, resume, cancel and a rollout replica killed mid-run."""

import threading
import time

import pytest
import torch

from tgc_rl.resources import ResourceError
from tgc_rl.trainer.checkpoints import Checkpoints, read_state
from tgc_rl.trainer.main import run
from tgc_rl.trainer.traces import read_page

from .conftest import kill_trainer_after_checkpoint, read_events, read_metrics, tiny_spec
from .test_async import _assert_the_k_step_correction_is_reported

pytestmark = pytest.mark.slow


def test_a_one_step_off_job_on_vllm_with_two_fsdp_ranks_corrects_for_the_sampler_and_keeps_cancellation(
    ray_cluster, tmp_path
):
    """The async behaviour correction end to end (issue 31): vLLM generates, 2 FSDP2 learner ranks train,
    weights go by broadcast, one_step_off with no objective override, so cp_grpo runs the async default
    (token TIS, C = 2); its metrics are asserted as on test_async.py's k_step job (HF engine, k = 2). The same
    job is the 2-rank vLLM job: the broadcast path, D1/D2, the policy versions and HF checkpoints."""
    spec = tiny_spec(
        **{
            "resources.rollout_engine": "vllm",
            "resources.learner_ranks": 2,
            "steps": 3,
            "resources.weight_sync": "broadcast",
            "async.mode": "one_step_off",
            # sharper sampling from the random model: copies of shared tokens, on which the spread of the
            # engine's log-probs and D2 are measured, in most groups (text parity still mixes rewards)
            "sampling.temperature": 0.1,
        }
    )
    assert run(spec, tmp_path) == "succeeded"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the first sync goes through the object store and opens the broadcast group; later ones broadcast
    assert [r["sync/broadcast"] for r in rows] == [0.0, 1.0, 1.0]
    for r in rows:
        assert (
            r.get("diag/d1_gcpr", 0.0) <= 1e-5 and r.get("diag/d2_residual", 0.0) <= 1e-5
        )  # cp_grpo cancels, under the behaviour correction too
        assert r["policy/version"] == r["step"] and r["timing/sync_s"] > 0
    # step 1 is sampled before any update; later steps while the learner trained the step before, by the
    # weights the previous sync broadcast (a broadcast that had not landed would show lag 2 at step 3)
    assert [r["policy/staleness_max"] for r in rows] == [0, 1, 1]
    _assert_the_k_step_correction_is_reported(rows, k=1)
    assert any(r["grad_norm"] > 0 for r in rows)  # mixed rewards reached the learner
    states = [e["state"] for e in read_events(tmp_path) if e["type"] == "state"]
    assert states == ["running", "succeeded"]
    from transformers import AutoModelForCausalLM

    ckpt = tmp_path / "checkpoints" / "step_3"
    assert read_state(ckpt)["version"] == 3
    AutoModelForCausalLM.from_pretrained(ckpt / "model")  # HF format


def test_one_step_off_on_vllm_with_broadcast_trains_one_version_old_and_grpo_keeps_groups_without_signal(
    ray_cluster, tmp_path
):
    """One job for three things: the one-step-off schedule (k_step, its generalisation, runs on the HF engine
    in test_async.py), broadcast weights while the replica generates the next step (the broadcast waits for
    that in-flight generation, as an object-store load does), and the plain (not dynamic) sampling of grpo
    with a reward that gives the even-indexed prompts all-equal groups (the reference of the dynamic sampling
    test)."""
    spec = tiny_spec(
        steps=4,
        name="async-bcast",
        objective={"name": "grpo"},
        **{
            "task.reward": "tests.trainer.rewards:parity_on_odd_items",
            "resources.rollout_engine": "vllm",
            "resources.weight_sync": "broadcast",
            "async.mode": "one_step_off",
            "async.max_staleness": 1,
            "checkpoint.every_steps": 0,
        },
    )
    assert run(spec, tmp_path) == "succeeded"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["sync/broadcast"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert rows[0]["policy/staleness_max"] == 0  # the first rollout is generated before any update
    # later rollouts were generated while the learner trained the previous step: one version behind
    assert [r["policy/staleness_max"] for r in rows[1:]] == [1, 1, 1]
    assert [r["policy/version"] for r in rows] == [1, 2, 3, 4]
    # without dynamic sampling half of every step's groups (the even-indexed prompts) carry no signal; grpo
    # does not preserve cancellation: each step says so beside its D2
    for r in rows:
        assert r["rollout/informative_groups"] <= 0.5 and r["objective/preserves_cancellation"] == 0.0


def test_a_trainer_killed_mid_step_resumes_exactly_and_drops_what_it_logged_after_its_last_checkpoint(
    ray_cluster, tmp_path
):
    """A trainer hard-killed during step 3 (its own local Ray, as `tgc train`) leaves no process behind; the
    resume redoes the lost step once, drops metrics and traces logged after the last checkpoint, and ends
    where an uninterrupted run of the same spec ends: same samples, same losses."""
    spec = tiny_spec(steps=4, **{"checkpoint.every_steps": 1})
    full, run_dir = tmp_path / "full", tmp_path / "run"
    assert run(spec, full) == "succeeded"
    kill_trainer_after_checkpoint(spec, run_dir, "step_2")  # step 3 is under way once step 2 is saved
    assert max(r["step"] for r in read_metrics(run_dir)) in (2, 3)
    # what a trainer killed after logging the next step but before checkpointing it leaves behind
    latest = Checkpoints(run_dir / "checkpoints", spec.checkpoint.keep_last).latest()  # what the resume takes
    assert latest is not None
    lost = read_state(latest)["step"] + 1
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(f'{{"step": {lost}, "loss": 123.0}}\n')
    traces = read_page(run_dir, limit=200).records
    with open(run_dir / "traces" / "steps-00000001.jsonl", "a") as fh:
        fh.write(traces[0].model_copy(update={"step": lost, "response": "lost"}).model_dump_json() + "\n")

    assert run(spec, run_dir, resume="latest") == "succeeded"
    a, b = read_metrics(full), read_metrics(run_dir)
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # step 3 redone once, none lost or duplicated
    assert [r["policy/version"] for r in b] == [1, 2, 3, 4]
    assert b[lost - 1]["loss"] != 123.0
    assert read_state(run_dir / "checkpoints" / "step_4")["data_position"] == 4 * spec.prompts_per_step
    for ra, rb in zip(a, b, strict=True):
        assert ra["reward/mean"] == rb["reward/mean"]  # same data order and samples
        assert rb["policy/staleness_max"] == 0  # resumed replicas carry the checkpoint's policy version
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-4, abs=1e-6)
    # the traces too: every step sampled once (group 0 whole, group 1's best/worst/random), with its fields
    traces = read_page(run_dir, limit=200).records
    assert sorted({r.step for r in traces}) == [1, 2, 3, 4] and "lost" not in {r.response for r in traces}
    for step in (1, 2, 3, 4):
        rows = [r for r in traces if r.step == step]
        assert [r.index for r in rows if r.group == 0] == [0, 1, 2, 3]
        assert 2 <= len([r for r in rows if r.group == 1]) <= 3
        for r in rows:
            assert r.prompt and r.status == "ok" and r.reward in (0.0, 1.0) and r.advantage is not None
            assert (
                r.policy_version == step - 1 and r.finish_reason in ("stop", "length") and 0 <= r.length <= 8
            )
            assert r.logprobs is None and isinstance(r.response, str)


def test_cancel_file_stops_at_a_step_boundary_with_a_checkpoint(ray_cluster, tmp_path):
    spec = tiny_spec(steps=200, **{"checkpoint.every_steps": 0})
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("state", run(spec, tmp_path)))
    thread.start()
    _wait_for_step(tmp_path, 1)
    (tmp_path / "CANCEL").write_text("test asked to stop")
    thread.join(timeout=300)
    assert result["state"] == "cancelled"
    last = read_metrics(tmp_path)[-1]["step"]
    assert last < 200 and read_state(tmp_path / "checkpoints" / f"step_{last}")["step"] == last
    final = [e for e in read_events(tmp_path) if e["type"] == "state"][-1]
    assert final["reason"] == "test asked to stop" and final["step"] == last
    _assert_no_job_actors(ray_cluster, "tiny")


def test_dynamic_sampling_replaces_groups_without_signal_and_a_killed_replica_is_restarted(
    ray_cluster, tmp_path
):
    """One job (two replicas, 6 steps) for both: dynamic sampling replaces the groups without signal at every
    step, also across a replica killed after step 2, which is restarted while the run finishes."""
    # the same reward without dynamic sampling leaves half the groups without signal: asserted on the plain
    # grpo job of test_one_step_off_on_vllm_with_broadcast_trains_one_version_old_and_grpo_keeps_groups_without_signal
    spec = tiny_spec(
        steps=6,
        name="faulty",
        dynamic_sampling=True,
        **{
            "task.reward": "tests.trainer.rewards:parity_on_odd_items",
            "checkpoint.every_steps": 0,
            "resources.rollout_replicas": 2,
        },
    )
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("state", run(spec, tmp_path)))
    thread.start()
    _wait_for_step(tmp_path, 2)
    ray_cluster.kill(ray_cluster.get_actor("faulty-rollout-0"))
    thread.join(timeout=600)
    assert result["state"] == "succeeded"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[-1]["rollout/restarts"] >= 1
    for r in rows:
        assert r["rollout/groups_dropped"] >= 1 and r["rollout/informative_groups"] == 1.0
        assert r["response/tokens"] > 0 and r["grad_norm"] > 0
        assert r["objective/preserves_cancellation"] == 1.0  # cp_grpo


def test_impossible_resources_fail_before_any_actor_starts(ray_cluster, tmp_path):
    spec = tiny_spec(name="toobig", **{"resources.gpus_per_learner": 1})
    with pytest.raises(ResourceError, match="GPU"):
        run(spec, tmp_path)
    _assert_no_job_actors(ray_cluster, "toobig")


def test_weights_reach_the_engine_through_the_object_store_and_by_broadcast_and_a_replaced_replica_rejoins(
    ray_cluster, tmp_path
):
    """After one update and an object-store sync, the engine's log-probs of a fixed sequence change and equal the
    learner's; then resources.weight_sync broadcast: weights go from 2 FSDP ranks straight into the vLLM replica
    (gloo here, NCCL on GPU); a replica that dies gets the current weights through the object store and the
    group reopens. One learner group and one replica for both (each costs a start-up)."""
    from tgc_rl.batch import collate
    from tgc_rl.learner import LearnerGroup
    from tgc_rl.models import model_dir
    from tgc_rl.rollout import RolloutPool
    from tgc_rl.weight_sync import WeightSync

    spec = tiny_spec(
        name="bcast",
        **{
            "resources.rollout_engine": "vllm",
            "resources.learner_ranks": 2,
            "resources.weight_sync": "broadcast",
        },
    )
    path = model_dir(spec.model, spec.seed)
    learner = LearnerGroup(spec, path, "bcast")
    pool = RolloutPool(spec, path, "bcast")
    try:
        prompt = [1, 540, 314, 3203, 28, 216, 33]
        outs = pool.generate([prompt], spec.group_size, [0])[0]
        rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
        batch = collate([prompt] * 4, outs, [0] * 4, rewards, 2).with_advantages(rewards - 0.5)
        seqs = [prompt + c.token_ids for c in outs]
        # the object store on its own (the pool's update_weights with the learner's published state dict)
        before = pool.score(seqs, len(prompt))
        learner.train_step(batch)
        pool.update_weights(learner.publish_weights(), 1)
        after = pool.score(seqs, len(prompt))
        trained = learner.logprobs(batch)
        for i, c in enumerate(outs):
            n = len(c.token_ids)
            assert max(abs(x - y) for x, y in zip(before[i], after[i], strict=True)) > 1e-3
            assert after[i] == pytest.approx(trained[i, :n].tolist(), abs=2e-2)

        sync = WeightSync(spec, learner, pool)

        def step_and_sync(version):
            before = pool.score(seqs, len(prompt))
            learner.train_step(batch)
            out = sync(version)
            after, trained = pool.score(seqs, len(prompt)), learner.logprobs(batch)
            for i, c in enumerate(outs):
                assert max(abs(x - y) for x, y in zip(before[i], after[i], strict=True)) > 1e-3
                assert after[i] == pytest.approx(trained[i, : len(c.token_ids)].tolist(), abs=2e-2)
            return out

        assert (
            step_and_sync(2)["broadcast"] == 0.0
        )  # the first sync goes through the object store, then the group opens
        assert step_and_sync(3)["broadcast"] == 1.0
        assert pool.generate([prompt], 2, [1])[0][0].version == 3  # the replica carries the broadcast version
        ray_cluster.kill(pool.actors[0])
        # the replacement loads the current (broadcast-only) weights through the object store before it scores
        assert pool.score(seqs, len(prompt))[0] == pytest.approx(
            learner.logprobs(batch)[0, : len(outs[0].token_ids)].tolist(), abs=2e-2
        )
        assert pool.restarts == 1
        assert (
            step_and_sync(4)["broadcast"] == 0.0
        )  # the new replica is not in the group: object store, reopen
        assert step_and_sync(5)["broadcast"] == 1.0
        # a replica that dies between generation and sync: the broadcast fails, the learner stays up, the
        # object store path replaces the replica and the group reopens
        ray_cluster.kill(pool.actors[0])
        learner.train_step(batch)
        assert sync(6)["broadcast"] == 0.0 and pool.restarts == 2
        assert step_and_sync(7)["broadcast"] == 1.0
    finally:
        pool.shutdown()
        learner.shutdown()


def _wait_for_step(run_dir, step, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "metrics.jsonl").exists() and any(r["step"] >= step for r in read_metrics(run_dir)):
            return
        time.sleep(0.5)
    raise TimeoutError(f"step {step} not reached")


def _assert_no_job_actors(ray, job_name):
    # named actors that are still alive, in every namespace (needs no dashboard, unlike ray.util.state)
    alive = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(job_name)]
    assert not alive, alive
