"""A job on a real two-node Ray cluster, built the way KubeRay builds one: a head (`ray start --head`) and a
worker (`ray start --address`) whose custom resource `tgc_accel` stands in for a GPU node's GPUs.

The learner ranks ask for `tgc_accel` and are packed onto one node by a placement group; the rollout
replicas are spread over the nodes. Ray's state API says where each actor ran. Losing the worker node
mid-run fails the job cleanly (the learner ranks were on it) and it resumes from its last checkpoint on a
new worker node with no step lost or repeated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ops.raynodes import RayNode, make_token, ray_env, state_api
from tests.proc_helpers import wait_for
from tests.specs import tiny_model

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ACCEL = "tgc_accel"


def job_spec(name: str, steps: int) -> dict:
    return {
        "name": name,
        "model": tiny_model(),
        "task": {"name": "arithmetic", "reward_workers": 1},
        "group_size": 2,
        "prompts_per_step": 2,
        "steps": steps,
        "sampling": {"max_new_tokens": 8},
        "optim": {"lr": 1e-3, "micro_batch_size": 4},
        "checkpoint": {"every_steps": 1, "keep_last": 10},
        "resources": {
            "rollout_engine": "hf",
            "learner_ranks": 2,
            "rollout_replicas": 2,
            "cpus_per_learner": 0.5,
            "cpus_per_rollout": 0.5,
            # as on GPU nodes: the learner group on one node that has the accelerators, the replicas spread
            "learner_placement": "strict_pack",
            "learner_custom_resources": {ACCEL: 1},
            "rollout_placement": "spread",
        },
    }


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.token = make_token(root / "ray-token")
        self.head = RayNode(root, "head", self.token, num_cpus=2)
        self.workers: list[RayNode] = []

    def add_worker(self) -> RayNode:
        node = RayNode(
            self.root,
            f"worker{len(self.workers)}",
            self.token,
            head_address=self.head.address,
            num_cpus=2,
            resources={ACCEL: 2},
        )
        self.workers.append(node)
        return node

    def node_of(self) -> dict[str, str]:
        """Ray node id -> 'head' / 'workerN', from the state API's node table."""
        names = {}
        for n in state_api(self.head.dashboard_url, self.token, "nodes"):
            total = n.get("resources_total") or {}
            if "node:__internal_head__" in total:
                names[n["node_id"]] = "head"
        alive_workers = [
            n["node_id"]
            for n in state_api(self.head.dashboard_url, self.token, "nodes")
            if n["node_id"] not in names
        ]
        for node_id in alive_workers:
            names[node_id] = "worker"
        return names

    def trainer(self, spec: dict, run_dir: Path, *extra: str) -> subprocess.Popen:
        """`python -m tgc_rl.trainer` as a driver on this cluster (what `ray job submit` runs)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir.parent / f"{run_dir.name}.yaml").write_text(yaml.safe_dump(spec))
        log = open(run_dir.parent / f"{run_dir.name}.log", "ab")
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tgc_rl.trainer",
                "--spec",
                str(run_dir.parent / f"{run_dir.name}.yaml"),
                "--run-dir",
                str(run_dir),
                *extra,
            ],
            cwd=ROOT,
            env=ray_env(self.token, RAY_ADDRESS=self.head.address, PYTHONPATH=str(ROOT)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            node.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("two-nodes"))
    try:
        c.add_worker()
        yield c
    finally:
        c.stop()


def _finish(proc: subprocess.Popen, timeout: float = 480) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln] if path.exists() else []


def test_a_resource_no_node_has_fails_the_job_naming_the_field(cluster, tmp_path):
    spec = job_spec("no-such-node", steps=1)
    spec["resources"]["learner_custom_resources"] = {"tgc_tpu": 1}
    proc = cluster.trainer(spec, tmp_path / "run")
    assert _finish(proc, 300) == 2  # refused before any actor starts, like every resource the cluster lacks
    last = [e for e in _lines(tmp_path / "run" / "events.jsonl") if e["type"] == "state"][-1]
    assert last["state"] == "failed", last
    assert "resources.learner_custom_resources" in last["reason"] and "tgc_tpu" in last["reason"], last


def _job_actors(cluster: Cluster, name: str) -> dict[str, dict]:
    return {
        a["name"]: a
        for a in state_api(cluster.head.dashboard_url, cluster.token, "actors")
        if a.get("name", "").startswith(f"{name}-")
    }


def test_learner_packed_on_the_accelerator_node_replicas_spread_and_losing_it_fails_cleanly_then_resumes(
    cluster, tmp_path
):
    """One job (4 steps) checks placement while it runs, then loses the worker node, fails, and resumes on a
    new worker node with no step lost or repeated."""
    run_dir = tmp_path / "run"
    spec = job_spec("two-nodes", steps=4)
    proc = cluster.trainer(spec, run_dir)
    try:
        wait_for(
            lambda: (run_dir / "checkpoints" / "step_1").exists() or proc.poll() is not None,
            420,
            "checkpoint of step 1",
        )
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]

        where = cluster.node_of()
        actors = _job_actors(cluster, "two-nodes")
        placed = {name: where[a["node_id"]] for name, a in actors.items()}
        (cluster.root / "placement.json").write_text(
            json.dumps(placed, indent=1)
        )  # where each actor ran (kept)
        roles = {name.removeprefix("two-nodes-").rstrip("-0123456789") for name in placed}
        assert roles == {"learner", "rollout", "reward"} and len(placed) >= 5, placed
        # strict_pack + the accelerator resource: both ranks on the one node that has it
        assert placed["two-nodes-learner-0"] == placed["two-nodes-learner-1"] == "worker"
        # spread: one replica per node
        assert {placed["two-nodes-rollout-0"], placed["two-nodes-rollout-1"]} == {"head", "worker"}
        groups = {
            g["name"]: g for g in state_api(cluster.head.dashboard_url, cluster.token, "placement_groups")
        }
        learner, rollout = groups["two-nodes-learner"]["bundles"], groups["two-nodes-rollout"]["bundles"]
        assert len(learner) == len(rollout) == 2  # one bundle per rank / replica
        assert all(ACCEL in json.dumps(b) for b in learner) and not any(
            ACCEL in json.dumps(b) for b in rollout
        )

        cluster.workers[-1].kill()  # the node is lost at once: its raylet, object store and actors
        rc = _finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 1, (tmp_path / "run.log").read_text()[-3000:]
    states = [e for e in _lines(run_dir / "events.jsonl") if e["type"] == "state"]
    assert states[-1]["state"] == "failed", states
    done = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))
    assert done and done[-1] < 4, done
    # a new accelerator node joins; the job resumes from its last checkpoint
    cluster.add_worker()
    resumed = cluster.trainer(spec, run_dir, "--resume")
    assert _finish(resumed) == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert [r["step"] for r in _lines(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]  # none lost or repeated
    assert [e["state"] for e in _lines(run_dir / "events.jsonl") if e["type"] == "state"][-1] == "succeeded"
    # both attempts' placement groups were released when their driver ended, and every actor is gone
    groups = state_api(cluster.head.dashboard_url, cluster.token, "placement_groups")
    assert {g["state"] for g in groups if g["name"].startswith("two-nodes-")} == {"REMOVED"}, groups
    assert all(a["state"] == "DEAD" for a in _job_actors(cluster, "two-nodes").values())
