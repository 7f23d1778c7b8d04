"""Testbed 3: SmolLM2-135M-Instruct through the project's real trainer (Ray, vLLM CPU, FSDP2 over gloo).

The study is a list of job specs (one per objective x task x seed). They run either here, one after the
other through `tgc_rl.trainer.main.run` (`python -m experiments trainer`), or through the control plane
as a sweep of jobs (`experiments.sweep`). Either way each run's per-step metrics (the trainer's
metrics.jsonl, or the same points from the control plane) are reduced by `summarise_metrics` to the
compact results format the report reads.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from experiments.paths import CACHE
from experiments.stats import summarize
from experiments.studies import OBJECTIVES, Condition
from tgc_rl.trainer.metrics import read_metrics

TASKS = {
    # 1-digit addition: SmolLM2-135M-Instruct samples ~0.46 correct at T=0.7, 11/12 groups mixed
    # (12 prompts x 8 samples, measured before the study), so group-relative advantages are informative from step 1.
    "arithmetic": {"name": "arithmetic", "params": {"max_operand": 9, "ops": ["+"]}},
    # A reasoning-gym task it can partly solve (1-digit +/-; ~0.05 correct at T=1.0, 4/12 groups mixed).
    "basic_arithmetic": {
        "name": "reasoning_gym:basic_arithmetic",
        "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"]},
    },
}

# Per-step metrics kept as curves, and the per-run final values (mean over the last quarter of steps,
# since single steps of 8 groups are noisy).
CURVE_KEYS = (
    "reward/accuracy",
    "diag/d1_gcpr",
    "diag/d2_residual",
    "diag/d7_entropy_mean",
    "diag/d7_entropy_common",
    "response/length_mean",
)
FINAL_KEYS = (
    "reward/accuracy",
    "reward/mean",
    "diag/d1_gcpr",
    "diag/d2_residual",
    "diag/d2_credit_frac",
    "diag/d2_nodes",
    "diag/d3_kappa_cv",
    "diag/d7_entropy_mean",
    "diag/d7_entropy_common",
    "diag/d7_entropy_divergent",
    "diag/d11_corr_len_adv",
    "response/length_mean",
    "diag/d4_groups_complete_frac",
)
WHOLE_RUN_KEYS = (
    "diag/d1_gcpr",
    "diag/d2_residual",
    "diag/d2_credit_frac",
    "diag/d2_nodes",
    "diag/d3_kappa_cv",
)
THRESHOLD = 0.75


_SMOLLM2 = {"source": "smollm2-135m-instruct", "dtype": "auto"}
# A random-init 2-layer Llama with SmolLM2's tokenizer and the transformers engine: checks the pipeline
# (trainer, control plane, collection, report) in a minute; its numbers mean nothing.
_TINY = {
    "source": "random",
    "dtype": "float32",
    "config_overrides": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "max_position_embeddings": 512,
    },
}


def study_plan(size: str = "small") -> dict[str, Any]:
    """small: what runs on a shared 2-core machine (grpo vs cp_grpo, arithmetic, 1 seed, 8 steps);
    full: the issue's comparison (10 objectives x 2 tasks x 3 seeds, 8 steps; ~13 min a run on 2 cores, so
    it is run in parts across sessions: `--objectives/--tasks/--seeds`); tiny: a pipeline check."""
    common = {
        "group_size": 8,
        "prompts_per_step": 8,
        "epochs": 2,
        "lr": 3e-6,
        "max_new_tokens": 24,
        "model": _SMOLLM2,
        "engine": "vllm",
    }
    if size == "small":
        return {
            **common,
            "name": "trainer_small",
            "size": "small",
            "objectives": ("grpo", "cp_grpo"),
            "tasks": ("arithmetic",),
            "seeds": (0,),
            "steps": 8,
            "command": "python -m experiments trainer --size small",
        }
    if size == "full":
        return {
            **common,
            "name": "trainer",
            "size": "full",
            "objectives": OBJECTIVES,
            "tasks": tuple(TASKS),
            "seeds": (0, 1, 2),
            "steps": 8,
            "command": "python -m experiments trainer --size full",
        }
    if size == "tiny":
        return {
            **common,
            "name": "trainer_tiny",
            "size": "tiny",
            "objectives": ("grpo", "cp_grpo"),
            "tasks": ("arithmetic",),
            "seeds": (0,),
            "steps": 2,
            "group_size": 4,
            "prompts_per_step": 2,
            "max_new_tokens": 8,
            "lr": 1e-4,
            "model": _TINY,
            "engine": "hf",
            "command": "python -m experiments trainer --size tiny",
        }
    raise ValueError(f"trainer study size must be 'small', 'full' or 'tiny', got {size!r}")


def job_spec(
    objective: str, task: str, seed: int, plan: dict[str, Any], name_prefix: str = "tgc-exp"
) -> dict[str, Any]:
    """The job spec (as a dict, valid for `JobSpec.parse`, the REST API and the SDK) of one run."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    return {
        "name": f"{name_prefix}-{objective}-{task}-s{seed}".replace("_", "-"),
        "model": plan["model"],
        "task": {**TASKS[task], "reward_workers": 1},
        "objective": {"name": objective},
        "group_size": plan["group_size"],
        "prompts_per_step": plan["prompts_per_step"],
        "steps": plan["steps"],
        "seed": seed,
        "sampling": {"temperature": 1.0, "max_new_tokens": plan["max_new_tokens"]},
        "optim": {"lr": plan["lr"], "micro_batch_size": 16, "ppo_epochs": plan["epochs"]},
        "resources": {"learner_ranks": 1, "rollout_replicas": 1, "rollout_engine": plan["engine"]},
        # The study reads metrics only: the one checkpoint (at the end) skips AdamW's moments and is
        # removed once the run's summary is written (`run_local`).
        "checkpoint": {"every_steps": 0, "keep_last": 1, "save_optimizer": False},
    }


def plan_runs(size: str = "small") -> list[tuple[Condition, int, dict[str, Any]]]:
    plan = study_plan(size)
    runs = []
    for task in plan["tasks"]:
        for objective in plan["objectives"]:
            cond = Condition(
                "main" if task == "arithmetic" else f"task:{task}", objective, {"task": task}, task
            )
            for seed in plan["seeds"]:
                runs.append((cond, seed, job_spec(objective, task, seed, plan)))
    return runs


def select_runs(
    size: str,
    objectives: Iterable[str] | None = None,
    tasks: Iterable[str] | None = None,
    seeds: Iterable[int] | None = None,
) -> list[tuple[Condition, int, dict[str, Any]]]:
    """The planned runs restricted to the given objectives/tasks/seeds (None: all); unknown names are refused."""
    plan = study_plan(size)
    wanted = {"objectives": objectives, "tasks": tasks, "seeds": seeds}
    for field, values in wanted.items():
        unknown = sorted(set(values or ()) - set(plan[field]), key=str)
        if unknown:
            raise ValueError(
                f"--{field}: {', '.join(map(str, unknown))} not in the {size} plan; "
                f"choose from {', '.join(map(str, plan[field]))}"
            )
    return [
        (cond, seed, spec)
        for cond, seed, spec in plan_runs(size)
        if (objectives is None or cond.objective in objectives)
        and (tasks is None or cond.setting["task"] in tasks)
        and (seeds is None or seed in seeds)
    ]


def summarise_metrics(points: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per-step metric dicts (each with `step`) -> {steps, curves, final} of one run."""
    pts = sorted(points, key=lambda p: p["step"])
    if not pts:
        raise ValueError("no metrics: the run reported no step")
    steps = [int(p["step"]) for p in pts]
    curves = {k: [_num(p.get(k)) for p in pts] for k in CURVE_KEYS}
    tail = max(1, len(pts) // 4)
    final = {}
    for key in FINAL_KEYS:
        # D1 is a property of the objective: averaged over every step where it was defined, not the tail.
        window = pts if key in WHOLE_RUN_KEYS else pts[-tail:]
        vals = np.asarray([_num(p.get(key)) for p in window], dtype=float)
        final[key] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
    acc = curves["reward/accuracy"]
    hit = [s for s, a in zip(steps, acc, strict=True) if a == a and a >= THRESHOLD]
    final["steps_to_threshold"] = float(hit[0]) if hit else float("nan")
    return {"steps": steps, "curves": curves, "final": final}


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and v is not None else float("nan")


def aggregate(
    plan: dict[str, Any], runs: list[tuple[Condition, int, dict[str, Any] | None]]
) -> dict[str, Any]:
    """Compact results (same format as the other testbeds) from summarised runs (None: the run failed)."""
    by_cond: dict[str, tuple[Condition, list[tuple[int, dict[str, Any]]]]] = {}
    for cond, seed, summary in runs:
        entry = by_cond.setdefault(cond.key, (cond, []))
        if summary is not None:
            entry[1].append((seed, summary))
    conditions = []
    for cond, items in by_cond.values():
        if not items:
            continue
        finals = {
            k: [_round(s["final"].get(k)) for _, s in items] for k in (*FINAL_KEYS, "steps_to_threshold")
        }
        curves = {}
        for key in CURVE_KEYS:
            n = min(len(s["curves"][key]) for _, s in items)
            arr = np.asarray([s["curves"][key][:n] for _, s in items], dtype=float)
            stats = [summarize(arr[:, i]) for i in range(n)]
            curves[key] = {
                "x": items[0][1]["steps"][:n],
                "mean": [_round(s.mean) for s in stats],
                "se": [_round(s.se) for s in stats],
            }
        conditions.append(
            {
                "key": cond.key,
                "group": cond.group,
                "objective": cond.objective,
                "label": cond.label,
                "setting": cond.setting,
                "preset": cond.objective,
                "overrides": {},
                "seeds": [seed for seed, _ in items],
                "final": finals,
                "curves": curves,
                "seconds": [_round(s.get("seconds", float("nan"))) for _, s in items],
            }
        )
    # The planned conditions, so that the report of a part-run study says what has not run yet.
    conds = {cond.key: cond for cond, _, _ in plan_runs(plan["size"])}
    planned = [
        {"key": c.key, "group": c.group, "objective": c.objective, "label": c.label} for c in conds.values()
    ]
    return {
        "study": plan["name"],
        "testbed": "trainer",
        "size": plan["size"],
        "seeds": list(plan["seeds"]),
        "planned": planned,
        "base": {
            "model": plan["model"]["source"],
            "tasks": list(plan["tasks"]),
            "steps": plan["steps"],
            **{k: plan[k] for k in ("group_size", "prompts_per_step", "epochs", "lr", "max_new_tokens")},
        },
        "command": plan["command"],
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "conditions": conditions,
    }


def _round(x: Any) -> float | None:
    if x is None or not isinstance(x, int | float) or not np.isfinite(x):
        return None
    return float(f"{x:.4g}")


def run_local(
    size: str,
    out_dir: Path,
    cache: Path = CACHE,
    log: Callable[[str], None] = print,
    runs: list[tuple[Condition, int, dict[str, Any]]] | None = None,
) -> Path:
    """Run the study's jobs here, one after the other, through the real trainer; resumable per run.

    runs: a part of the plan (`select_runs`) to train now; the results file covers every finished run of the
    plan either way, so a study can be completed in parts across sessions and machines: each run's summary is
    kept beside the results (`<out_dir>/<study>_runs/<run>.json`, committed with them), and conditions of an
    earlier results file with no run summary here are carried over when they were made under the same plan.
    One local Ray cluster serves all runs (the trainer reuses an initialised Ray), so a study pays Ray's
    start-up once; a run that fails is logged, left out, and retried by the next invocation.
    """
    import ray

    from tgc_rl.config import JobSpec
    from tgc_rl.trainer.main import run as train

    plan = study_plan(size)
    run_root = Path(cache) / "trainer_runs" / plan["name"]
    summaries = run_summaries_dir(out_dir, plan)
    summaries.mkdir(parents=True, exist_ok=True)
    results = []
    started = False
    try:
        todo = {spec["name"] for _, _, spec in (plan_runs(size) if runs is None else runs)}
        for cond, seed, spec_dict in plan_runs(size):
            run_dir = run_root / spec_dict["name"]
            summary_path = summaries / f"{spec_dict['name']}.json"
            legacy = run_dir / "summary.json"  # where earlier versions kept it
            if not summary_path.exists() and legacy.exists():
                summary_path.write_text(legacy.read_text())
            if not summary_path.exists() and spec_dict["name"] not in todo:
                continue
            if not summary_path.exists():
                if not ray.is_initialized():
                    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
                    started = True
                log(f"[{plan['name']}] {spec_dict['name']}: starting ({spec_dict['steps']} steps)")
                t0 = time.perf_counter()
                state = train(JobSpec.parse(spec_dict), run_dir)
                seconds = time.perf_counter() - t0
                metrics = run_dir / "metrics.jsonl"
                if state != "succeeded" or not metrics.exists():
                    log(f"[{plan['name']}] {spec_dict['name']}: {state}; left out of the results")
                    results.append((cond, seed, None))
                    continue
                summary = {
                    **summarise_metrics(read_metrics(metrics.parent)),
                    "seconds": seconds,
                    "state": state,
                }
                summary_path.write_text(json.dumps(summary))
                shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # ~0.6 GB a run, never read again
                log(f"[{plan['name']}] {spec_dict['name']}: {state} in {seconds:.0f}s")
            results.append((cond, seed, json.loads(summary_path.read_text())))
    finally:
        if started:
            ray.shutdown()
    return write_results(plan, results, out_dir, log=lambda msg: log(f"[{plan['name']}] {msg}"))


def write_results(
    plan: dict[str, Any],
    runs: list[tuple[Condition, int, dict[str, Any] | None]],
    out_dir: Path,
    log: Callable[[str], None] = print,
) -> Path:
    """Aggregate the runs into `<out_dir>/<study>.json`, keeping the earlier file's other conditions."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{plan['name']}.json"
    fresh = aggregate(plan, runs)
    previous = json.loads(out.read_text()) if out.exists() else None
    fresh["conditions"] = merge_conditions(fresh, previous, log=log)
    out.write_text(json.dumps(fresh, indent=1))
    log(f"wrote {out}")
    return out


def run_summaries_dir(out_dir: Path, plan: dict[str, Any]) -> Path:
    """Where a study's per-run summaries live: beside its results file, so they travel with it."""
    return Path(out_dir) / f"{plan['name']}_runs"


def merge_conditions(
    fresh: dict[str, Any], previous: dict[str, Any] | None, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """The fresh results' conditions plus those of an earlier results file that no run summary here covers.

    An earlier condition is carried over only when it was made by the same study under the same settings
    (`base`); otherwise it is dropped with a line saying so, since its numbers would not be comparable.
    Carried conditions are marked with the date of the file they came from and keep the plan's order.
    """
    if not previous or not previous.get("conditions"):
        return fresh["conditions"]
    have = {c["key"] for c in fresh["conditions"]}
    old = [c for c in previous["conditions"] if c["key"] not in have]
    if not old:
        return fresh["conditions"]
    if previous.get("study") != fresh["study"] or previous.get("base") != fresh["base"]:
        log(
            f"dropping {len(old)} condition(s) of the earlier results file: made under other settings "
            f"({previous.get('study')}, {previous.get('base')})"
        )
        return fresh["conditions"]
    for cond in old:
        cond.setdefault("carried_from", previous.get("created"))
    order = {c["key"]: i for i, c in enumerate(fresh["planned"])}
    return sorted([*fresh["conditions"], *old], key=lambda c: order.get(c["key"], len(order)))
