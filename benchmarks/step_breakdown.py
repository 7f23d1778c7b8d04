"""Where a training step's wall time goes: generation, reward, forward/backward, weight sync, and the rest
(the driver's own overhead: collation, advantages, bookkeeping). Target: overhead under 5% of the step.

Runs a real job (local Ray, the spec's engines and learner) and reads its metrics.jsonl.
    .venv/bin/python benchmarks/step_breakdown.py [examples/default.yaml] [--steps 6] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from tgc_rl.config import JobSpec
from tgc_rl.trainer.main import run

PHASES = ["timing/generate_s", "timing/reward_s", "timing/train_s", "timing/sync_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", nargs="?", default="examples/default.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument(
        "--threads", type=int, default=None, help="resources.threads_per_actor (default: the spec's)"
    )
    args = ap.parse_args()
    spec = JobSpec.from_yaml(args.spec)
    spec.steps = args.steps
    spec.checkpoint.every_steps = 0
    if args.threads:
        spec.resources.threads_per_actor = args.threads
    with tempfile.TemporaryDirectory() as d:
        state = run(spec, Path(d), progress=False)
        rows = [json.loads(ln) for ln in (Path(d) / "metrics.jsonl").read_text().splitlines()]
    rows = rows[1:] or rows  # the first step pays one-off warm-up costs
    print(
        f"job {spec.name}: {state}; {len(rows)} steps measured; threads per actor "
        f"{spec.resources.threads_per_actor or 'default'}; load average {os.getloadavg()[0]:.2f}"
    )
    step = statistics.median(r["timing/step_s"] for r in rows)
    print(f"{'phase':<22}{'median s':>10}{'share':>9}")
    accounted = 0.0
    for p in PHASES:
        v = statistics.median(r.get(p, 0.0) for r in rows)
        accounted += v
        print(f"{p:<22}{v:>10.3f}{v / step:>9.1%}")
    overhead = statistics.median(
        (r["timing/step_s"] - sum(r.get(p, 0.0) for p in PHASES)) / r["timing/step_s"] for r in rows
    )
    print(f"{'overhead (rest)':<22}{step - accounted:>10.3f}{overhead:>9.1%}   target < 5%")
    print(f"{'step':<22}{step:>10.3f}")


if __name__ == "__main__":
    main()
