"""Learning per step over seeds (issues 31 item 4, 35 item 5): the default job in four variants, each trained
for the spec's steps at seeds 0, 1, 2 through the product entry point (tgc_rl.trainer.main.run), checkpoints off.

Variants of the base spec: `sync` (the spec itself, full weights), `one_step_off` and `k_step` (max_staleness 2;
both with the async default behaviour correction) and `lora` (sync, rank 16, alpha 32, lr 10x the spec's: the
LoraSpec docstring's rule, chosen before any run and the only LoRA lr run).

Held-out accuracy: 1-digit addition has only 100 distinct problems and training draws them with replacement
(15 steps x 8 prompts = 120 draws cover ~70), so no disjoint held-out set of the task exists. Every run is
evaluated greedily at the start and the end on all 100 problems (a fixed file, results/learning_seeds/
heldout.jsonl), scored with the task's own rule (last number == answer), and also on the subset that run never
trained on (`unseen`: which problems a seed draws is known from the task's item(index)).

Each run is a child process (its own Ray) under `flock /tmp/tgc-heavy.lock`, so other heavy work can take the lock
between runs; its JSON goes to results/learning_seeds/<variant>-seed<N>.json and, with --commit, is committed at
once. Runs whose JSON exists are skipped (a killed session resumes). Order: seed-major.

    .venv/bin/python benchmarks/learning_seeds.py [--spec examples/default.yaml] [--commit]
    .venv/bin/python benchmarks/learning_seeds.py --report        # the summary table into RESULTS.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from tgc_rl.config import cpu_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results" / "learning_seeds"
HELDOUT_FILE = "heldout.jsonl"
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- learning_seeds:begin -->", "<!-- learning_seeds:end -->"
LOCK = "/tmp/tgc-heavy.lock"
SEEDS = (0, 1, 2)
LORA_LR_FACTOR = 10.0  # LoraSpec: "LoRA usually wants ~10x the full fine-tuning optim.lr"
WINDOWS = ((1, 5), (6, 10), (11, 15))  # reward averaged over these steps (1-based, inclusive)
TARGET_REWARD = 0.9
WARM_UP = 2  # steps left out of the mean step seconds: one-off costs, the async queue filling


@dataclass(frozen=True)
class Variant:
    name: str
    mode: Literal["sync", "one_step_off", "k_step"] = "sync"
    max_staleness: int = 1
    lora: bool = False


VARIANTS = (
    Variant("sync"),
    Variant("one_step_off", "one_step_off", 1),
    Variant("k_step", "k_step", 2),
    Variant("lora", lora=True),
)
LORA = {"rank": 16, "alpha": 32}


def variant(name: str) -> Variant:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise ValueError(f"unknown variant {name!r}; known: {', '.join(v.name for v in VARIANTS)}")


def run_order(
    seeds: Sequence[int] = SEEDS, variants: Sequence[Variant] = VARIANTS
) -> list[tuple[int, Variant]]:
    """Seed-major: every variant of seed 0, then seed 1's, ... (a partial sweep still compares variants)."""
    return [(s, v) for s in seeds for v in variants]


def result_path(results: Path, v: Variant, seed: int) -> Path:
    return results / f"{v.name}-seed{seed}.json"


def pending(results: Path, order: list[tuple[int, Variant]]) -> list[tuple[int, Variant]]:
    """The runs of `order` whose JSON is not there yet (a finished run is never repeated)."""
    return [(s, v) for s, v in order if not result_path(results, v, s).is_file()]


# -- the job spec ---------------------------------------------------------------------------------
def heldout_rows(params: dict[str, Any]) -> list[dict[str, str]]:
    """Every problem of an arithmetic task's params, in a fixed order, in the task's own prompt template; `id` is
    the row's 0-based index (the evaluation records name their row by it)."""
    from tgc_rl.tasks.arithmetic import _OPS, ArithmeticParams

    p = ArithmeticParams.model_validate(params)
    span = range(p.min_operand, p.max_operand + 1)
    problems = [(a, op, b) for op in p.ops for a, b in itertools.product(span, span)]
    return [
        {"id": str(i), "prompt": p.template.format(a=a, op=op, b=b), "answer": str(_OPS[op](a, b))}
        for i, (a, op, b) in enumerate(problems)
    ]


def write_heldout(path: Path, params: dict[str, Any]) -> Path:
    rows = heldout_rows(params)
    if len(rows) > 10_000:
        raise ValueError(f"{len(rows)} problems: this harness evaluates every problem of a small task only")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def job_dict(
    base: dict[str, Any], v: Variant, seed: int, heldout: Path, steps: int | None = None
) -> dict[str, Any]:
    """The base spec (a parsed YAML mapping) as variant `v` at `seed`, checkpoints off, held-out eval on."""
    d = json.loads(json.dumps(base))  # a deep copy
    d["seed"] = seed
    if steps is not None:
        d["steps"] = steps
    d["checkpoint"] = {**d.get("checkpoint", {}), "every_steps": 0, "save_optimizer": False}
    d["async"] = {"mode": v.mode, "max_staleness": v.max_staleness}
    if v.lora:
        d["model"] = {**d["model"], "lora": dict(LORA)}
        d["optim"] = {**d.get("optim", {}), "lr": float(d.get("optim", {}).get("lr", 1e-5)) * LORA_LR_FACTOR}
    # start and end only: a mid-run evaluation waits on the async modes' in-flight rollout (a replica serves one
    # call at a time) and shifts generation time out of the step clock being compared
    d["eval"] = {
        "dataset": {"path": str(heldout), "verifier": "math", "id_column": "id"},
        "every_steps": 0,
        "greedy": True,
    }
    return d


# -- one run --------------------------------------------------------------------------------------
def score_eval(
    records: list[dict[str, Any]], rows: list[dict[str, str]], trained: set[str]
) -> dict[str, float]:
    """Held-out accuracy of one evaluation's records (eval/step_<N>.jsonl, one greedy sample per row, `row` its
    index): by the arithmetic task's rule, on every row and on the rows whose prompt the run never trained on."""
    from tgc_rl.tasks.answers import last_number

    correct = {int(r["row"]): last_number(r["response"]) == rows[int(r["row"])]["answer"] for r in records}
    if sorted(correct) != list(range(len(rows))):
        raise ValueError(f"evaluation covered {len(correct)} of {len(rows)} held-out rows")
    unseen = [i for i in correct if rows[i]["prompt"] not in trained]
    return {
        "accuracy": sum(correct.values()) / len(correct),
        "accuracy_unseen": sum(correct[i] for i in unseen) / len(unseen) if unseen else float("nan"),
        "n_unseen": float(len(unseen)),
        "accuracy_verifier": sum(float(r["reward"]) for r in records) / len(records),  # the math verifier
    }


def wrong_answers(records: list[dict[str, Any]], rows: list[dict[str, str]]) -> list[tuple[int, str]]:
    """(row, response) of every record the task's rule scores wrong: what a drop in accuracy consists of."""
    from tgc_rl.tasks.answers import last_number

    wrong = [(int(r["row"]), r["response"]) for r in records]
    return sorted((i, text) for i, text in wrong if last_number(text) != rows[i]["answer"])


def run_one(spec_path: str, v: Variant, seed: int, out: Path, steps: int | None) -> dict[str, Any]:
    from tgc_rl.config import JobSpec
    from tgc_rl.run_layout import EVAL_ACCURACY, REWARD_MEAN, TIMING_STEP
    from tgc_rl.tasks import load_task
    from tgc_rl.trainer.main import run

    base = yaml.safe_load(Path(spec_path).read_text())
    if base["task"]["name"] != "arithmetic":
        raise ValueError("the held-out set is every problem of an `arithmetic` task")
    heldout = write_heldout(out / HELDOUT_FILE, base["task"].get("params") or {})
    rows = [json.loads(ln) for ln in heldout.read_text().splitlines()]
    spec = JobSpec.parse(job_dict(base, v, seed, heldout, steps), source=spec_path)
    task = load_task(spec.task.name, spec.task.params, spec.seed)
    trained = {task.item(i).prompt for i in range(spec.steps * spec.prompts_per_step)}
    load0, started = os.getloadavg()[0], time.time()
    run_dir = Path(tempfile.mkdtemp(prefix=f"learning-{v.name}-{seed}-"))
    try:
        t0 = time.perf_counter()
        state = run(spec, run_dir, progress=False)
        wall = time.perf_counter() - t0
        metrics = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
        evals = []
        for m in metrics:
            if EVAL_ACCURACY in m:
                recs = [
                    json.loads(ln)
                    for ln in (run_dir / "eval" / f"step_{m['step']}.jsonl").read_text().splitlines()
                ]
                evals.append(
                    {
                        "step": m["step"],
                        "eval_s": m["timing/eval_s"],
                        **score_eval(recs, rows, trained),
                        "wrong": wrong_answers(recs, rows),
                    }
                )
        steps_out = [
            {
                "step": m["step"],
                "reward": m[REWARD_MEAN],
                "step_s": m[TIMING_STEP],
                **{k: m[k] for k in ("timing/generate_s", "timing/train_s", "timing/sync_s") if k in m},
            }
            for m in metrics
            if TIMING_STEP in m
        ]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)  # disk: the run dir holds the model's weights
    return {
        "variant": asdict(v),
        "seed": seed,
        "state": state.value,
        "spec": spec_path,
        "lr": spec.optim.lr,
        "steps": steps_out,
        "evals": evals,
        "wall_s": wall,
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "load_start": load0,
        "load_end": os.getloadavg()[0],
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "heldout_rows": len(rows),
        "trained_prompts": len(trained),
    }


# -- the summary ----------------------------------------------------------------------------------
def _mean_sd(xs: list[float]) -> str:
    if len(xs) < 2:  # one seed has no spread; do not print one
        return f"{xs[0]:.3f}" if xs else "-"
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def window_reward(r: dict[str, Any], lo: int, hi: int) -> float | None:
    xs = [s["reward"] for s in r["steps"] if lo <= s["step"] <= hi]
    return statistics.fmean(xs) if len(xs) == hi - lo + 1 else None


def seconds_to(r: dict[str, Any], target: float = TARGET_REWARD) -> float | None:
    """Summed step seconds up to and including the first step whose training reward reaches `target`."""
    total = 0.0
    for s in sorted(r["steps"], key=lambda s: s["step"]):
        total += s["step_s"]
        if s["reward"] >= target:
            return total
    return None


def summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant (in VARIANTS order): the per-seed figures, ready for the table."""
    rows = []
    for v in VARIANTS:
        runs = sorted((r for r in results if r["variant"]["name"] == v.name), key=lambda r: r["seed"])
        if not runs:
            continue
        row: dict[str, Any] = {"variant": v.name, "seeds": [r["seed"] for r in runs], "lr": runs[0]["lr"]}
        for lo, hi in WINDOWS:
            row[f"reward_{lo}_{hi}"] = [x for r in runs if (x := window_reward(r, lo, hi)) is not None]
        first = [min(r["evals"], key=lambda e: e["step"]) for r in runs if r["evals"]]
        last = [max(r["evals"], key=lambda e: e["step"]) for r in runs if r["evals"]]
        row["heldout_start"] = [e["accuracy"] for e in first]
        row["heldout_end"] = [e["accuracy"] for e in last]
        row["unseen_end"] = [e["accuracy_unseen"] for e in last]
        row["step_s"] = [statistics.fmean(s["step_s"] for s in r["steps"][WARM_UP:]) for r in runs]
        row["train_s"] = [sum(s["step_s"] for s in r["steps"]) for r in runs]
        row["to_target_s"] = [seconds_to(r) for r in runs]
        row["wall_s"] = [r["wall_s"] for r in runs]
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| variant | seeds | lr | reward 1-5 | reward 6-10 | reward 11-15 | held-out start | held-out end "
        "| unseen end | step s | 15 steps s | s to reward 0.9 | run wall s |\n" + "|---" * 13 + "|\n"
    )
    lines = []
    for r in rows:
        reached = [x for x in r["to_target_s"] if x is not None]
        to = (
            f"{statistics.fmean(reached):.0f} ({len(reached)}/{len(r['seeds'])})"
            if reached
            else "not reached"
        )
        lines.append(
            f"| {r['variant']} | {','.join(map(str, r['seeds']))} | {r['lr']:.0e} | "
            + " | ".join(_mean_sd(r[f"reward_{lo}_{hi}"]) for lo, hi in WINDOWS)
            + f" | {_mean_sd(r['heldout_start'])} | {_mean_sd(r['heldout_end'])} | {_mean_sd(r['unseen_end'])}"
            + f" | {statistics.fmean(r['step_s']):.1f} | {statistics.fmean(r['train_s']):.0f} | {to}"
            + f" | {statistics.fmean(r['wall_s']):.0f} |"
        )
    return head + "\n".join(lines) + "\n"


def per_run_table(results: list[dict[str, Any]]) -> str:
    """One line per run: with 3 seeds, the individual values say more than a spread."""
    out = "| variant | seed | reward 11-15 | held-out start -> end | unseen end | 15 steps s | run wall s |\n"
    out += "|---" * 7 + "|\n"
    order = {v.name: i for i, v in enumerate(VARIANTS)}
    for r in sorted(results, key=lambda r: (order[r["variant"]["name"]], r["seed"])):
        evals = sorted(r["evals"], key=lambda e: e["step"])
        late = window_reward(r, *WINDOWS[-1])
        out += (
            f"| {r['variant']['name']} | {r['seed']} | {'-' if late is None else f'{late:.3f}'} | "
            f"{evals[0]['accuracy']:.2f} -> {evals[-1]['accuracy']:.2f} | {evals[-1]['accuracy_unseen']:.2f} | "
            f"{sum(s['step_s'] for s in r['steps']):.0f} | {r['wall_s']:.0f} |\n"
        )
    return out


def per_step_table(results: list[dict[str, Any]]) -> str:
    """Mean training reward of each step per variant (over the seeds run)."""
    names = [v.name for v in VARIANTS if any(r["variant"]["name"] == v.name for r in results)]
    steps = sorted({s["step"] for r in results for s in r["steps"]})
    out = "| step | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|\n"
    for k in steps:
        cells = []
        for n in names:
            xs = [
                s["reward"]
                for r in results
                if r["variant"]["name"] == n
                for s in r["steps"]
                if s["step"] == k
            ]
            cells.append(f"{statistics.fmean(xs):.3f}" if xs else "-")
        out += f"| {k} | " + " | ".join(cells) + " |\n"
    return out


def load_results(results: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("*-seed*.json"))]


def report(results: Path, md: Path) -> str:
    found = load_results(results)
    if not found:
        raise SystemExit(f"no results in {results}")
    body = (
        f"{len(found)} runs; mean ± sd over seeds (sample sd); CPU {found[0]['cpu']}, {found[0]['cores']} cores; "
        f"runs started {min(r['started_utc'] for r in found)} to {max(r['started_utc'] for r in found)} UTC; "
        f"load average at the runs' starts {min(r['load_start'] for r in found):.1f}-"
        f"{max(r['load_start'] for r in found):.1f}. Step s: the mean of steps {WARM_UP + 1}-15; 15 steps s and "
        f"s to reward {TARGET_REWARD}: summed step seconds (evaluation and start-up excluded).\n\n"
        + table(summary(found))
        + "\nPer run:\n\n"
        + per_run_table(found)
        + "\nTraining reward per step (mean over the seeds run):\n\n"
        + per_step_table(found)
    )
    text = md.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{md}: no {BEGIN} ... {END} block to fill")
    head, rest = text.split(BEGIN, 1)
    md.write_text(head + BEGIN + "\n" + body + END + rest.split(END, 1)[1])
    return body


# -- the sweep ------------------------------------------------------------------------------------
def _commit(paths: list[Path]) -> None:
    """Stage and commit exactly these paths in one command (the tree is shared: nothing else is staged)."""
    rel = " ".join(str(p.relative_to(ROOT)) for p in paths)
    cmd = f"git add {rel} && git commit -q -m 'learning_seeds: {paths[0].stem}' -- {rel}"
    for _ in range(20):  # another engineer's commit may hold the index for a moment
        if not (ROOT / ".git" / "index.lock").exists():
            done = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True)
            if done.returncode == 0:
                return
            print(f"commit of {rel} failed: {done.stderr.strip()}", flush=True)
        time.sleep(3)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="examples/default.yaml")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    ap.add_argument("--steps", type=int, help="override the spec's steps (plumbing checks)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--variants", nargs="+", default=[v.name for v in VARIANTS])
    ap.add_argument("--commit", action="store_true", help="commit each run's JSON as soon as it is written")
    ap.add_argument("--report", action="store_true", help="write the summary into benchmarks/RESULTS.md")
    ap.add_argument("--one", nargs=2, metavar=("VARIANT", "SEED"), help=argparse.SUPPRESS)  # a child run
    args = ap.parse_args(argv)
    if args.report:
        print(report(args.out, RESULTS_MD))
        return
    if args.one:
        v, seed = variant(args.one[0]), int(args.one[1])
        result = run_one(args.spec, v, seed, args.out, args.steps)
        path = result_path(args.out, v, seed)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}", flush=True)
        return
    order = pending(args.out, run_order(args.seeds, [variant(n) for n in args.variants]))
    print(f"{len(order)} runs to do: {', '.join(f'{v.name}-seed{s}' for s, v in order)}", flush=True)
    for seed, v in order:
        cmd = ["flock", LOCK, sys.executable, __file__, "--spec", args.spec, "--out", str(args.out)]
        cmd += ["--one", v.name, str(seed)] + (["--steps", str(args.steps)] if args.steps else [])
        print(f"{time.strftime('%H:%M:%S')} {v.name} seed {seed}", flush=True)
        done = subprocess.run(cmd, cwd=ROOT)
        path = result_path(args.out, v, seed)
        if done.returncode != 0 or not path.is_file():
            print(f"{v.name} seed {seed} failed (exit {done.returncode}); going on", flush=True)
            continue
        if args.commit:
            _commit([path, args.out / HELDOUT_FILE])


if __name__ == "__main__":
    main()
