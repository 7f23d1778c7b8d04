"""Issue 30's "Done when": a custom environment written from docs/multi_turn.md alone (tests/envs/doc_env.py) runs
over REST with the custom-code grant (refused without it, field named) and through the `tgc train` CLI without
the control plane, on its own local Ray, with `eval:` evaluating whole trajectories (this is also the test of
`tgc train` itself: its exit code, its last line, its checkpoint and step events); two short jobs, the
transformers engine and a tiny random model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.servers import auth, control_plane_with_ray
from tests.trainer.conftest import BASE, read_metrics
from tgc_rl.sdk import Client

pytestmark = pytest.mark.slow
JOB_TIMEOUT = 600
ENV = {
    "name": "tests.envs.doc_env:CountingEnv",
    "params": {"answer_turn": 2},  # turn 1 goes to the tool, turn 2 is the answer
    "bounds": {"max_turns": 3, "max_total_tokens": 256, "max_observation_tokens": 32, "deadline_s": 120},
}
ROWS = ["What is 2 + 2?", "Name a colour.", "What is 3 * 3?"]


def job(name: str, steps: int, **more) -> dict:
    return {
        **BASE,
        "name": name,
        "steps": steps,
        "env": ENV,
        "sampling": {**BASE["sampling"], "max_prompt_tokens": 256},
        "checkpoint": {"every_steps": 0},  # only at the end: the steps are what is checked
        **more,
    }


def test_a_custom_environment_written_from_the_doc_runs_over_rest_with_the_grant_and_through_tgc_train(
    tmp_path,
):
    data_dir = tmp_path / "plane"
    with control_plane_with_ray(data_dir) as cp:
        # the built-in reward: the environment is the one privileged field (rewards 0, the steps still run)
        spec = job("doc-env-rest", steps=1, task={"name": "arithmetic", "reward_workers": 1})
        tenant = cp.create_token("acme")
        refused = httpx.post(f"{cp.url}/v1/jobs", json=spec, headers=auth(tenant), timeout=30)
        assert refused.status_code == 422, refused.text
        assert [d["field"] for d in refused.json()["detail"]] == ["env.name"]
        assert "custom code" in refused.json()["detail"][0]["msg"]

        with Client(cp.url, cp.create_token("ops", admin=True)) as admin:  # an admin's job holds the grant
            rest = admin.submit(spec).wait(JOB_TIMEOUT)
            assert rest.state.value == "succeeded", rest.reason + rest.driver_log()[-3000:]
            (point,) = rest.metrics()
        assert point.step == 1
        assert point.metrics["multi_turn/trajectories"] == 8 and point.metrics["multi_turn/tool_calls"] > 0

    # `tgc train` without the control plane, on its own local Ray (a local run: the operator's grants)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p, "answer": "4"}) + "\n" for p in ROWS))
    spec_file = tmp_path / "job.yaml"
    evaluation = {"dataset": {"path": str(rows)}, "at_start": False}
    spec_file.write_text(yaml.safe_dump(job("doc-env-cli", steps=2, eval=evaluation)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGC_", "RAY_"))}
    run_dir = tmp_path / "run"
    tgc = Path(sys.executable).with_name("tgc")
    proc = subprocess.run(
        [str(tgc), "train", str(spec_file), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=JOB_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "doc-env-cli: succeeded" in proc.stdout
    assert (run_dir / "checkpoints" / "step_2").is_dir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["type"] == "step"] == [1, 2]

    rows_ = read_metrics(run_dir)
    steps = [r for r in rows_ if "multi_turn/trajectories" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # every trajectory: a tool call on turn 1, the answer on turn 2 (or a bound before it)
        assert r["multi_turn/trajectories"] == 8 and 0 < r["multi_turn/tool_calls"] <= 8
        assert 1 < r["multi_turn/turns_per_trajectory"] <= 2 and r["multi_turn/observation_tokens"] > 0
    # eval at the end (step 2): the held-out rows as whole trajectories in the same environment
    (final,) = [r for r in rows_ if "eval/accuracy" in r]
    assert final["step"] == 2 and final["eval/samples"] == len(ROWS) and final["eval/prompts"] == len(ROWS)
    assert 1 < final["eval/turns_per_trajectory"] <= 2 and 0 < final["eval/tool_call_frac"] <= 1
    assert 0 <= final["eval/accuracy"] == final["eval/pass@1"] <= 1
    records = [json.loads(ln) for ln in (run_dir / "eval" / "step_2.jsonl").read_text().splitlines()]
    assert len(records) == len(ROWS) and all(r["mode"] == "greedy" for r in records)
    answered = [r for r in records if r["end_reason"] == "done"]
    assert answered, records
    for r in answered:
        assert r["turns"] == 2 and r["tool_calls"] == 1 and r["reward"] in (0.0, 1.0)
        roles = [m["role"] for m in r["transcript"]]
        assert roles[-4:] == ["user", "assistant", "tool", "assistant"]
        assert r["transcript"][-2]["content"].endswith(" bytes")  # the tool's answer, from its own process
