"""IBPO vs cp_grpo vs grpo through the real trainer (SmolLM2-135M-Instruct, vLLM CPU, arithmetic), same task
and seeds.

    python -m experiments.ibpo_compare run --objective cp_grpo --seed 0      # one run -> results/ibpo/<run>.json
    python -m experiments.ibpo_compare run --objective ibpo_cp --seed 0 [--mask naive]
    python -m experiments.ibpo_compare report                                # results/ibpo/*.json -> ibpo_results.md

Each run keeps its per-step metrics (accuracy, D1/D2 of the learner, IBPO's revision figures and the D1/D2 of
all three credit masks on the same batches) in its own JSON, so runs can be added one at a time. Tables,
findings and the figure: experiments/ibpo_report.py (also REPORT.md's IBPO section, `python -m experiments report`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from experiments.trainer_study import job_spec, study_plan

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "ibpo"
REPORT = HERE / "ibpo_results.md"
CACHE = HERE / ".cache" / "ibpo_runs"
PLAN = {
    **study_plan("small"),
    "steps": 4,
    "epochs": 1,
    "lr": 3e-5,
    "prompts_per_step": 8,
    "group_size": 8,
    "max_new_tokens": 24,
}
KEYS = (
    "reward/accuracy",
    "reward/mean",
    "diag/d1_gcpr",
    "diag/d2_residual",
    "diag/d2_nodes",
    "diag/d2_credit_frac",
    "diag/d7_entropy_mean",
    "timing/step_s",
    "timing/generate_s",
    "timing/reward_s",
    "rollout/tokens",
)


def spec_for(objective: str, seed: int, mask: str | None, steps: int) -> dict[str, Any]:
    spec = job_spec(objective, "arithmetic", seed, {**PLAN, "steps": steps}, name_prefix="tgc-ibpo")
    if mask is not None:
        spec["ibpo"] = {"mask": mask}
        spec["name"] += f"-{mask}"
    return spec


def run_one(objective: str, seed: int, mask: str | None, steps: int) -> Path:
    import ray

    from tgc_rl.config import JobSpec
    from tgc_rl.trainer.main import run as train

    spec = spec_for(objective, seed, mask, steps)
    code = code_version()
    run_dir = CACHE / spec["name"]
    shutil.rmtree(run_dir, ignore_errors=True)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        state = train(JobSpec.parse(spec), run_dir)
        seconds = time.perf_counter() - t0
    finally:
        ray.shutdown()
    metrics = run_dir / "metrics.jsonl"  # absent when a job fails before its first step
    rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln] if metrics.exists() else []
    keep = [{k: v for k, v in r.items() if k == "step" or k in KEYS or k.startswith("ibpo/")} for r in rows]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{spec['name']}.json"
    out.write_text(
        json.dumps(
            {"spec": spec, "state": state, "seconds": round(seconds, 1), "code": code, "steps": keep},
            indent=1,
        )
        + "\n"
    )
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return out


def code_version() -> dict[str, Any]:
    """The commit a run started from and the files that differed from it (the checkout is shared with others
    at work, so uncommitted changes of theirs can be part of a run)."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True, check=False)
        return done.stdout

    changed = [ln[3:] for ln in git("status", "--porcelain", "--", "rlcore", "tgc_rl").splitlines()]
    return {"commit": git("rev-parse", "HEAD").strip(), "uncommitted": changed}


def report() -> Path:
    from experiments.ibpo_report import load, results_markdown

    REPORT.write_text(results_markdown(load(RESULTS), PLAN))
    return REPORT


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("--objective", default="cp_grpo")
    one.add_argument("--seed", type=int, default=0)
    one.add_argument(
        "--mask",
        choices=("none", "naive", "symmetric"),
        default=None,
        help="the ibpo section's mask (default: no section; ibpo_cp then uses symmetric)",
    )
    one.add_argument("--steps", type=int, default=PLAN["steps"])
    sub.add_parser("report")
    args = parser.parse_args(argv)
    if args.command == "run":
        print(run_one(args.objective, args.seed, args.mask, args.steps))
    print(report())


if __name__ == "__main__":
    main()
