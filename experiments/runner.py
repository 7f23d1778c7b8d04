"""Run a study's (condition, seed) runs, in worker processes, with a resumable on-disk cache.

Every finished run is written to `<cache>/runs/<study>/<key>.json` at once (atomically), so an
interrupted study resumes where it stopped; the key includes a hash of the run's full configuration,
so a changed setting never reuses a stale result. Aggregation reads the cache back and produces the
compact results file (per-seed final values, mean ± s.e. curves) that plots and the report use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from experiments.paths import CACHE
from experiments.stats import summarize
from experiments.studies import Condition, Study

# What the compact results keep (everything else stays in the per-run cache files).
FINAL_KEYS = {
    "tabular": (
        "success",
        "t75",
        "p_verbose",
        "template_drift",
        "template_entropy",
        "opener_logodds",
        "filler_entropy",
        "solution_logodds",
        "cancel_resid",
        "diag/d1_groups_with_prefix_frac",
        "diag/d3_kappa_cv",
        "diag/d3_corr_kappa_len",
        "diag/d4_groups_complete_frac",
        "diag/d4_adv_sum_abs_mean",
        "diag/d7_entropy_mean",
        "diag/d7_entropy_common",
        "diag/d7_entropy_divergent",
        "diag/d10_clipfrac_common_pos",
        "diag/d10_clipfrac_common_neg",
        "diag/d11_corr_len_adv",
    ),
    "tinylm": (
        "eval/accuracy",
        "eval/steps_to_threshold",
        "eval/accuracy_gain",
        "eval/p_verbose",
        "eval/template_drift",
        "eval/template_entropy",
        "eval/p_template",
        "eval/opener_drift",
        "eval/equiv_drift",
        "probe/kl",
        "probe/kl_template",
        "probe/dlogp",
        "probe/learning_tax",
        "diag/d1_gcpr",
        "diag/d1_groups_with_prefix_frac",
        "diag/d3_kappa_cv",
        "diag/d3_corr_kappa_len",
        "diag/d4_groups_complete_frac",
        "diag/d7_entropy_mean",
        "diag/d7_entropy_common",
        "diag/d7_entropy_divergent",
        "rollout/entropy_forking",
        "rollout/length",
        "rollout/length_correct",
        "rollout/length_wrong",
        "rollout/verbose_frac",
        "diag/d11_corr_len_adv",
        "clip/frac",
        "diag/d10_clipfrac_common_pos",
        "diag/d10_clipfrac_common_neg",
    ),
}
CURVE_KEYS = {
    "tabular": ("success", "p_verbose", "template_drift", "filler_entropy", "diag/d1_gcpr"),
    "tinylm": (
        "eval/accuracy",
        "eval/p_verbose",
        "eval/template_drift",
        "probe/kl",
        "rollout/length_correct",
        "rollout/length_wrong",
        "diag/d1_gcpr",
        "diag/d7_entropy_mean",
    ),
}


# -- one run ------------------------------------------------------------------------------------------
def run_config(testbed: str, cond: Condition, base: dict[str, Any], seed: int) -> Any:
    """The testbed's run configuration object for one (condition, seed)."""
    preset, overrides = cond.preset()
    settings = {**base, **cond.setting}
    if testbed == "tabular":
        from experiments.tabular import TabularRun, ToyConfig

        toy_fields = {f.name for f in dataclasses.fields(ToyConfig)}
        extra = {k: v for k, v in settings.items() if k not in toy_fields}
        unknown = set(extra) - {"mini_batches", "split_groups", "trace_every", "threshold"}
        if unknown:
            raise ValueError(f"tabular setting(s) {sorted(unknown)} are not ToyConfig or TabularRun fields")
        toy = ToyConfig(**{k: v for k, v in settings.items() if k in toy_fields}, seed=seed)
        return TabularRun(preset, overrides, toy, **extra)
    if testbed == "tinylm":
        from experiments.tinylm.train import RunConfig

        return RunConfig(objective=preset, overrides=overrides, seed=seed, **settings)
    raise ValueError(f"unknown testbed {testbed!r}; expected 'tabular' or 'tinylm'")


def _execute(testbed: str, config: Any) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # the machine is shared: one core per worker
    if testbed == "tabular":
        from experiments.tabular import run

        return run(config)
    from experiments.tinylm.train import run as run_tinylm

    return run_tinylm(config)


def run_key(cond: Condition, seed: int, config: Any) -> str:
    blob = json.dumps(_jsonable(config), sort_keys=True, default=str)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:10]
    return f"{cond.key.replace('/', '__')}__seed{seed}__{digest}"


def _jsonable(config: Any) -> Any:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config


# -- a study ------------------------------------------------------------------------------------------
def run_study(
    study: Study,
    out_dir: Path,
    workers: int = 1,
    cache: Path = CACHE,
    log: Callable[[str], None] = print,
    runs: list[tuple[Condition, int]] | None = None,
) -> Path:
    """Run every missing (condition, seed) of `study` (or of `runs`, a part of it: `Study.select`); after each
    run and at the end, write `<out_dir>/<study>.json` from every cached run of the whole study."""
    raw_dir = Path(cache) / "runs" / study.name
    raw_dir.mkdir(parents=True, exist_ok=True)
    runs = study.runs() if runs is None else runs
    todo = []
    for cond, seed in runs:
        config = run_config(study.testbed, cond, study.base, seed)
        path = raw_dir / f"{run_key(cond, seed, config)}.json"
        if not path.exists():
            todo.append((cond, seed, config, path))
    todo.sort(key=lambda item: _priority(study, item[0], item[1]))
    total = len(runs)
    part = "" if total == len(study.runs()) else f" (selected of {len(study.runs())})"
    log(
        f"[{study.name}] {total - len(todo)}/{total} runs cached{part}, {len(todo)} to run with {workers} worker(s)"
    )
    t0 = time.perf_counter()
    done = 0

    def store(cond: Condition, seed: int, path: Path, result: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(result))
        tmp.replace(path)
        eta = (time.perf_counter() - t0) / done * (len(todo) - done)
        log(
            f"[{study.name}] {done}/{len(todo)} {cond.key} seed {seed}: {result['seconds']:.0f}s (eta {eta / 60:.0f} min)"
        )
        write()  # after every run: a study stopped part-way still leaves a current results file

    def write() -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"{study.name}.json"
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(aggregate(study, raw_dir), indent=1))
        tmp.replace(out)
        return out

    if workers <= 1:
        for cond, seed, config, path in todo:
            store(cond, seed, path, _execute(study.testbed, config))
    else:
        # spawn: fresh interpreters, no forked torch thread pools
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn")
        ) as pool:
            futures = {
                pool.submit(_execute, study.testbed, config): (cond, seed, path)
                for cond, seed, config, path in todo
            }
            for fut in as_completed(futures):
                cond, seed, path = futures[fut]
                store(cond, seed, path, fut.result())
    out = write()
    log(f"[{study.name}] wrote {out}")
    return out


def _priority(study: Study, cond: Condition, seed: int) -> tuple[int, int, int]:
    """Run order: the first three seeds of everything (main setting first), then the remaining seeds, so an
    interrupted study still has every condition at three seeds rather than some at five and some at none."""
    rank = study.seeds.index(seed)
    groups = [c.group for c in study.conditions]
    return (rank >= 3, groups.index(cond.group), rank)


def aggregate(study: Study, raw_dir: Path) -> dict[str, Any]:
    """Compact results: per condition, per-seed finals of FINAL_KEYS and mean ± s.e. curves."""
    conditions = []
    for cond in study.conditions:
        runs = []
        for seed in study.seeds:
            config = run_config(study.testbed, cond, study.base, seed)
            path = raw_dir / f"{run_key(cond, seed, config)}.json"
            if path.exists():
                runs.append(json.loads(path.read_text()))
        if not runs:
            continue
        finals = {key: [_r(_final(run, key)) for run in runs] for key in FINAL_KEYS[study.testbed]}
        curves = {}
        if cond.group == "main" or study.size != "full":
            curves = {key: _curve(runs, key) for key in CURVE_KEYS[study.testbed] if key in runs[0]["curves"]}
        conditions.append(
            {
                "key": cond.key,
                "group": cond.group,
                "objective": cond.objective,
                "label": cond.label,
                "setting": cond.setting,
                "preset": cond.preset()[0],
                "overrides": cond.preset()[1],
                "seeds": [
                    run["config"].get("seed", run["config"].get("toy", {}).get("seed")) for run in runs
                ],
                "final": finals,
                "curves": curves,
                "seconds": [_r(run["seconds"]) for run in runs],
            }
        )
    # The planned study, so that a report of a part-run study can say what has not run yet.
    planned = [
        {"key": c.key, "group": c.group, "objective": c.objective, "label": c.label} for c in study.conditions
    ]
    return {
        "study": study.name,
        "testbed": study.testbed,
        "size": study.size,
        "seeds": list(study.seeds),
        "planned": planned,
        "base": study.base,
        "command": study.command,
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "conditions": conditions,
    }


def _final(run: dict[str, Any], key: str) -> float:
    value = run["final"].get(key, float("nan"))
    if key == "eval/steps_to_threshold" and not np.isfinite(value):
        return float(
            run["config"]["steps"]
        )  # never reached: censored at the step budget (as testbed 1's t75)
    return value


def _curve(runs: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
    steps = runs[0].get("eval_steps", runs[0].get("trace_steps"))
    rows = [run["curves"][key] for run in runs]
    n = min(len(r) for r in rows)
    x = steps if n == len(steps) else steps[1:]  # interval metrics: one value per interval, at its end
    arr = np.asarray([r[:n] for r in rows], dtype=float)
    stats = [summarize(arr[:, i]) for i in range(n)]
    return {"x": list(x[:n]), "mean": [_r(s.mean) for s in stats], "se": [_r(s.se) for s in stats]}


def _r(x: float) -> float | None:
    """4 significant digits (keeps the committed JSON small); None for non-finite values."""
    if x is None or not np.isfinite(x):
        return None
    return float(f"{x:.4g}")
