"""The pool of rollout replicas on a real local Ray cluster, with real vLLM engines (bf16) in the actors."""

import threading
import time

import psutil
import pytest
import torch

from tests.rollout.rollout_helpers import (
    PROMPTS,
    perturbed,
    reference_logprobs,
    reference_model,
    rollout_spec,
)

pytestmark = pytest.mark.slow
pytest.importorskip("vllm")

JOB = "rt-pool"


@pytest.fixture(scope="module")
def pool(ray_cluster, tiny_bf16_path):
    from tgc_rl.rollout import RolloutPool

    p = RolloutPool(
        rollout_spec("vllm", dtype="bfloat16", replicas=2, max_new_tokens=48), tiny_bf16_path, JOB
    )
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def bf16_state(tiny_bf16_path):
    return {
        k: v.detach().clone()
        for k, v in reference_model(tiny_bf16_path, dtype=torch.bfloat16).named_parameters()
    }


def _twins(pool, seed=11):
    """The same prompt and seed on both replicas (the pool sends prompt 0 to replica 0, prompt 1 to replica 1)."""
    return pool.generate([PROMPTS[0], PROMPTS[0]], 2, [seed, seed])


def test_replicas_are_named_actors_of_the_job(pool, ray_cluster):
    for i in range(2):
        assert ray_cluster.get_actor(f"{JOB}-rollout-{i}") is not None


def test_generate_splits_whole_prompts_across_replicas(pool, ray_cluster):
    before = [ray_cluster.get(a.stats.remote())["tokens"] for a in pool.actors]
    out = pool.generate(PROMPTS + PROMPTS[:1], 3, [0, 1, 2, 3])
    assert [len(cs) for cs in out] == [3, 3, 3, 3]
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for cs in out for c in cs)
    after = [ray_cluster.get(a.stats.remote())["tokens"] for a in pool.actors]
    assert all(a > b for a, b in zip(after, before, strict=True))  # both replicas generated
    first, second = _twins(pool)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]  # same weights, same seed


def test_update_weights_reaches_every_replica(pool, tiny_bf16_path, bf16_state):
    from tgc_rl.weight_sync.flat import publish_weights

    seq = PROMPTS[1] + [300, 301, 302, 303, 304]
    before = pool.score([seq], len(PROMPTS[1]))[0]
    new = perturbed(bf16_state, seed=7)
    sync = pool.update_weights(publish_weights(new), 1)
    assert sync["sync_s"] > 0 and sync["bytes"] == sum(t.numel() * t.element_size() for t in new.values())
    after = pool.score([seq], len(PROMPTS[1]))[0]
    ref = reference_logprobs(reference_model(tiny_bf16_path, new), seq, len(PROMPTS[1]))
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 0.1
    assert after == pytest.approx(ref, abs=5e-2)  # bf16 activations in vLLM vs fp32 transformers
    first, second = _twins(pool)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert {c.version for c in first + second} == {1}


def test_a_plain_state_dict_ref_loads_too(pool, ray_cluster, bf16_state):
    new = perturbed(bf16_state, seed=8)
    sync = pool.update_weights(ray_cluster.put(new), 2)
    assert sync["bytes"] > 0 and pool.version == 2
    assert {c.version for cs in _twins(pool) for c in cs} == {2}


def test_a_replica_killed_mid_generation_is_restarted_and_the_call_completes(pool, ray_cluster):
    prompts, seeds = PROMPTS * 3, list(range(9))
    t0 = time.perf_counter()
    pool.generate(prompts, 4, seeds)
    took = time.perf_counter() - t0
    result: dict = {}
    # twice the samples of the timed call, killed at 0.4 of its time: inside the call on a machine of any speed
    worker = threading.Thread(target=lambda: result.update(out=pool.generate(prompts, 8, seeds)))
    worker.start()
    time.sleep(0.4 * took)
    ray_cluster.kill(ray_cluster.get_actor(f"{JOB}-rollout-1"))
    worker.join(timeout=600)
    assert not worker.is_alive()
    out = result["out"]
    assert [len(cs) for cs in out] == [8] * 9 and all(c.token_ids for cs in out for c in cs)
    assert pool.stats()["restarts"] == 1
    # the new replica 1 was loaded with the latest weights: it samples what replica 0 samples
    first, second = _twins(pool)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert {c.version for c in first + second} == {pool.version}


def test_broadcast_protocol_loads_weights_into_every_replica(pool, tiny_bf16_path, bf16_state):
    """vLLM's native weight-transfer protocol with each replica at its own rank (gloo here, NCCL on GPU)."""
    from tgc_rl.weight_sync.gloo import GlooSender

    client = pool.sync_client()
    assert client.offsets == [1, 2] and client.world_size == 3
    sender = GlooSender(client, "127.0.0.1", _free_port())
    new = perturbed(bf16_state, seed=9)
    sender.send(new, version=7)
    seq = PROMPTS[2] + [400, 401, 402]
    ref = reference_logprobs(reference_model(tiny_bf16_path, new), seq, len(PROMPTS[2]))
    assert pool.score([seq], len(PROMPTS[2]))[0] == pytest.approx(ref, abs=5e-2)
    first, second = _twins(pool)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert {c.version for c in first + second} == {7}


def test_shutdown_leaves_no_processes(pool):
    pids = pool.pids()
    assert pids
    pool.shutdown()
    deadline = time.time() + 60
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
