"""Testbed 3 as a sweep through the control plane: one job per (objective, task, seed).

    python -m experiments sweep submit --size full      # prints and saves the manifest
    python -m experiments sweep collect                 # waits, fetches metrics, writes results + report

Submission goes through the Python SDK (`tgc_rl.sdk.Client`, REST only), so the sweep runs wherever the
control plane sends jobs (a local Ray cluster or KubeRay). The manifest (job ids per run) is a JSON file;
collection reads each job's per-step metrics back from the control plane and reduces them exactly like a
local run's metrics.jsonl (`trainer_study.summarise_metrics`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.paths import CACHE
from experiments.studies import Condition
from experiments.trainer_study import plan_runs, study_plan, summarise_metrics, write_results

DEFAULT_MANIFEST = CACHE / "sweep_manifest.json"


def submit(
    client: Any,
    size: str = "small",
    manifest: Path = DEFAULT_MANIFEST,
    name_prefix: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Submit every run of the study as a job; write and return the manifest."""
    plan = study_plan(size)
    prefix = name_prefix or f"tgc-exp-{time.strftime('%m%d%H%M')}"
    entries = []
    for cond, seed, spec in plan_runs(size):
        spec = {**spec, "name": spec["name"].replace("tgc-exp", prefix, 1)}
        # The idempotency key makes a re-run of `submit` after a network error not duplicate jobs.
        job = client.submit(spec, idempotency_key=f"{prefix}-{spec['name']}")
        entries.append(
            {
                "condition": {
                    "group": cond.group,
                    "objective": cond.objective,
                    "setting": cond.setting,
                    "label": cond.label,
                },
                "seed": seed,
                "job_id": job.id,
                "name": spec["name"],
            }
        )
        log(f"submitted {spec['name']} as job {job.id}")
    data = {
        "size": size,
        "study": plan["name"],
        "submitted": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "url": getattr(client, "url", None),
        "runs": entries,
    }
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(data, indent=1))
    log(f"manifest: {manifest} ({len(entries)} jobs)")
    return data


def collect(
    client: Any,
    manifest: Path = DEFAULT_MANIFEST,
    out_dir: Path | None = None,
    wait: bool = True,
    timeout: float | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Wait for the manifest's jobs, fetch their metrics and write `<out_dir>/<study>.json`."""
    from experiments.paths import RESULTS

    data = json.loads(Path(manifest).read_text())
    plan = study_plan(data["size"])
    runs = []
    for entry in data["runs"]:
        c = entry["condition"]
        cond = Condition(c["group"], c["objective"], c["setting"], c["label"])
        job = client.job(entry["job_id"])
        if wait and not job.done:
            log(f"waiting for {entry['name']} ({job.id})")
            job = job.wait(timeout=timeout)
        state = job.state.value if hasattr(job.state, "value") else str(job.state)
        if state != "succeeded":
            log(f"{entry['name']}: {state} ({job.reason}); left out of the results")
            runs.append((cond, entry["seed"], None))
            continue
        points = [
            {"step": p.step, **{k: v for k, v in p.metrics.items() if v is not None}} for p in job.metrics()
        ]
        summary = summarise_metrics(points)
        record = job.record
        if record.started_at and record.finished_at:
            summary["seconds"] = (record.finished_at - record.started_at).total_seconds()
        runs.append((cond, entry["seed"], summary))
        log(f"{entry['name']}: {len(points)} steps collected")
    command = (
        f"python -m experiments sweep submit --size {data['size']} && python -m experiments sweep collect"
    )
    return write_results(
        {**plan, "command": command}, runs, Path(out_dir) if out_dir is not None else RESULTS, log=log
    )
