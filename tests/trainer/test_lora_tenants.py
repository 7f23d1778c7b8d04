"""Two LoRA jobs on one base train at the same time against one shared vLLM engine (issue 35, item 4;
`resources.rollout_sharing: shared`, tgc_rl/rollout/shared.py); the engine is killed after the first step and
the jobs carry on with a new one (the rollout pool's restart path)."""

import threading

import pytest

from tests.proc_helpers import alive, wait_until
from tests.trainer.conftest import read_metrics, tiny_spec
from tgc_rl.rollout.pool import RolloutPool
from tgc_rl.rollout.shared import GRACE_ENV, NAME_PREFIX, NAMESPACE

pytestmark = pytest.mark.slow

LORA = {"rank": 4, "alpha": 8, "canary_tolerance": 1e-3}  # fp32 on both sides: agreement to ~1e-6


def _spec(name: str, lr: float):
    return tiny_spec(
        name=name,
        steps=2,
        **{
            "model.lora": LORA,
            "optim.lr": lr,  # the two adapters differ: a job served the other's adapter would fail its canary
            "resources.rollout_engine": "vllm",
            "resources.rollout_sharing": "shared",
            "checkpoint.every_steps": 0,
        },
    )


def test_two_lora_jobs_train_concurrently_against_one_shared_engine_which_exits_after_both(
    ray_cluster, tmp_path, monkeypatch
):
    ray = ray_cluster
    from tgc_rl.models import model_dir
    from tgc_rl.trainer.main import run

    monkeypatch.setenv(GRACE_ENV, "2")  # the engine exits 2 s after the last job detached
    specs = {"tenant-a": _spec("tenant-a", 5e-2), "tenant-b": _spec("tenant-b", 1e-2)}
    model_dir(specs["tenant-a"].model, 0)  # built once before the threads

    # the engine's canary scores, per job (the canary is the only score() call of these jobs)
    canaries: dict[str, list[list[float]]] = {name: [] for name in specs}
    real_score = RolloutPool.score

    def score(self, sequences, prompt_len):
        out = real_score(self, sequences, prompt_len)
        canaries[self.job_name].append(out[0])
        return out

    monkeypatch.setattr(RolloutPool, "score", score)

    # the engine process behind every attach (the first ones, and the restarts after the kill)
    attaches: list[tuple[str, int]] = []
    real_create = RolloutPool._create

    def create(self, i):
        handle = real_create(self, i)
        attaches.append((self.job_name, ray.get(handle.ready.remote())["pid"]))
        return handle

    monkeypatch.setattr(RolloutPool, "_create", create)

    # watch the cluster's named actors (Ray's control store; the state API needs the dashboard, which this
    # cluster runs without) and the engine's tenants while the jobs run; kill the engine once a job has a step
    seen_actors: set[str] = set()
    most_tenants = 0
    killed: list[int] = []
    done = threading.Event()

    def first_step_done() -> bool:
        paths = [tmp_path / n / "metrics.jsonl" for n in specs]
        return any(p.exists() and p.read_text().strip() for p in paths)

    def watch():
        nonlocal most_tenants
        while not done.is_set():
            names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
            seen_actors.update(n for n in names if "rollout" in n or n.startswith(NAME_PREFIX))
            for n in names:
                if n.startswith(NAME_PREFIX):
                    try:
                        engine = ray.get_actor(n, namespace=NAMESPACE)
                        info = ray.get(engine.describe.remote(), timeout=60)
                        most_tenants = max(most_tenants, len(info["tenants"]))
                        if not killed and first_step_done():
                            ray.kill(engine, no_restart=True)
                            killed.append(info["pid"])
                    except Exception:  # dead or retiring
                        pass
            done.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    states: dict[str, str] = {}
    jobs = [
        threading.Thread(target=lambda n=n, s=s: states.__setitem__(n, run(s, tmp_path / n)), name=n)
        for n, s in specs.items()
    ]
    for t in jobs:
        t.start()
    for t in jobs:
        t.join(timeout=900)
    done.set()
    watcher.join(timeout=120)

    assert states == {"tenant-a": "succeeded", "tenant-b": "succeeded"}
    engines = {n for n in seen_actors if n.startswith(NAME_PREFIX)}
    assert len(engines) == 1, seen_actors  # one engine name for both jobs ...
    assert seen_actors == engines  # ... and no job started replicas of its own
    assert most_tenants == 2  # both jobs were attached at once
    # both jobs attached to one engine process; the killed engine was replaced by one process (created by one
    # job, found by the other), which every job that restarted attached to
    first = {job: pid for job, pid in reversed(attaches)}
    assert sorted(first) == sorted(specs) and set(first.values()) == set(killed), (attaches, killed)
    later = attaches[2:]
    assert later and len({pid for _, pid in later}) == 1 and later[0][1] not in killed, attaches
    restarts = {n: read_metrics(tmp_path / n)[-1]["rollout/restarts"] for n in specs}
    assert restarts == {n: float(sum(job == n for job, _ in later)) for n in specs}, (restarts, attaches)

    for name in specs:
        rows = read_metrics(tmp_path / name)
        assert [r["step"] for r in rows] == [1, 2]
        # the canary passed on every sync, against the job's own adapter
        assert all(0 <= r["sync/canary_logprob_diff"] <= LORA["canary_tolerance"] for r in rows)
        assert len(canaries[name]) == 2
    # the engine served two different policies: after the last sync the two jobs' canaries differ by more than
    # the tolerance, so a job served the other's adapter would have failed its canary
    a, b = canaries["tenant-a"][-1], canaries["tenant-b"][-1]
    assert sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a) > LORA["canary_tolerance"]

    # both detached; the engine exits after its grace and nothing of it is left
    def engine_gone():
        names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
        return not names & engines

    assert wait_until(engine_gone, timeout=60)
    assert wait_until(lambda: not any(alive(pid) for _, pid in attaches), timeout=30)
