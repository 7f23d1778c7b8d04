"""Testbed 5: grpo against cp_grpo with the length gap kept open, one pre-registered endpoint.

SmolLM2-135M-Instruct answers two-digit additions with a short explanation ending in "Answer: <number>",
through the project's trainer (Ray, vLLM CPU engine, one FSDP2 learner rank). A response cap set by the pilot
cuts 25-50% of the base model's responses, so wrong responses stay long. The plan, fixed before any run:
`testbed5_plan.md` beside this file; the report section: `testbed5_report.py`.

The harness, in the order it runs:
- the data (`write_data`): regex-verified rows, 250 held-out unordered pairs in both orders, committed;
- the pilot (`run_pilot`): the response cap from one sampling of the base model re-scored at each candidate
  cap, the learning rate from two 40-step cp_grpo runs, the budget rule; each step writes a dated decision
  file (`results/testbed5/pilot_*.json`) and stops the pilot where the plan says no study run may start.
  Each rule is a pure function of measured numbers (`decide_cap`, `decide_lr`, `decide_budget`);
- the study (`run_study`): `tb5-<objective>-s<seed>` runs, alternating arms, each evaluated every 10 steps,
  probed at the plan's eight named steps (testbed 4's `Prober`), and given a greedy evaluation of every
  held-out row on its final checkpoint (an eval-only job). Its specs are refused until the pilot's three
  decisions are recorded.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from experiments import testbed4
from experiments.paths import CACHE, RESULTS
from experiments.testbed4 import Prober, as_float, base_model_path, format_metrics
from tgc_rl.trainer.metrics import read_metrics

OBJECTIVES = ("grpo", "cp_grpo")
SEEDS = (0, 1, 2, 3, 4, 5)
DATA = RESULTS / "testbed5"
RUNS = RESULTS / "testbed5_runs"
PLAN_FILE = Path(__file__).resolve().parent / "testbed5_plan.md"
MODEL = {"source": "smollm2-135m-instruct", "dtype": "auto"}
MAX_OPERAND = 49  # amended 2026-11-27 (was 99): testbed5_plan.md, Amendments
HELDOUT_PAIRS = 250  # unordered pairs {a, b}: both orders of a pair are held out together
EVAL_PROMPTS = 128  # the first rows of the shuffled held-out file: the periodic evaluation set
DATA_SEED = 5
FIRST_TEMPLATE = "What is {a} + {b}? Explain your steps briefly, then finish with 'Answer: <number>'."
REPEAT_TEMPLATE = (
    "What is {a} + {b}? Explain your steps briefly. End your reply with the line 'Answer: <number>', "
    "where <number> is {a} + {b}."
)
TEMPLATE = REPEAT_TEMPLATE  # amended 2026-11-27 (was FIRST_TEMPLATE): testbed5_plan.md, Amendments
# The right sum is the response's last number: no digit after it, and not the tail of a longer number or a
# decimal. Amended 2026-11-27 (was: one "Answer:" in the whole response, followed by the right number,
# FIRST_PATTERN): testbed5_plan.md, Amendments. Only the last number counts, so listing candidates earns nothing.
FIRST_PATTERN = r"(?is)\A(?!.*answer:.*answer:).*answer:\s*\**\s*<c>(?!\d)"
PATTERN = r"(?s)(?<![\d.])<c>(?!.*\d)"


@dataclass(frozen=True)
class Design:
    """The study's shape; the pilot's budget rule picks the full one or the cut one."""

    seeds: tuple[int, ...]
    steps: int
    named_evals: tuple[int, ...]  # the evaluations the analysis reads (the runs evaluate every 10 steps)


FULL = Design(SEEDS, 100, (0, 10, 20, 30, 40, 60, 80, 100))
CUT = Design(SEEDS[:5], 80, (0, 10, 20, 30, 40, 60, 80))
PROMPTS_PER_STEP = 8
GROUP_SIZE = 8
TEMPERATURE = 0.7
MICRO_BATCH = 16
EVAL_EVERY = (
    10  # the trainer's schedule is uniform: every 10 steps, of which the analysis reads `named_evals`
)
EVAL_SAMPLES = 4

# Pilot (plan, "Pilot"): seed 100 is outside the study.
PILOT_SEED = 100
PILOT_PROMPTS = 64
PILOT_SAMPLES = 8
PILOT_SAMPLING_CAP = 256
CANDIDATE_CAPS = (48, 64, 80, 96, 112, 128, 160, 192)
GATE_ACCURACY = (0.10, 0.60)
GATE_MIXED = 0.30
GATE_RESIDUAL = 0.15
GATE_TRUNCATION = (0.25, 0.50)
TRUNCATION_TARGET = 0.35
PILOT_LRS = (1e-5, 3e-5)
FALLBACK_LR = 3e-6
LR_STEPS = 40
LR_WINDOW = (26, 30)  # "at step 30": the mean of steps 26-30
LR_MIN_ENTROPY = 0.1
# The length gap as a share of the mean response length: the manipulation check's threshold (steps 1-50 of a
# study run) and, amended 2026-11-28 after the three lr runs, the lr rule's second gate in place of truncation
# >= 10% (testbed5_plan.md, Amendments).
GAP_SHARE_MIN = 0.15
BUDGET_HOURS = 10.0
PILOT_COMMAND = "python -m experiments testbed5 pilot --commit --lock /tmp/tgc-heavy.lock"
CAP_FILE, LR_FILE, BUDGET_FILE = "pilot_cap.json", "pilot_lr.json", "pilot_budget.json"


# ---------------------------------------------------------------- data


def pattern(total: int) -> str:
    """The row's regex reference: the plan's pattern with the right sum."""
    return PATTERN.replace("<c>", str(total))


def addition_rows(
    max_operand: int = MAX_OPERAND,
    heldout_pairs: int = HELDOUT_PAIRS,
    seed: int = DATA_SEED,
    template: str = TEMPLATE,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, held-out rows): testbed 4's split (every ordered pair a + b; a fixed draw of unordered pairs
    held out with both orders, so a commuted training question is not held out; the held-out rows in a fixed
    shuffle) with this study's prompt (or the wording probe's `template`) and regex reference."""
    train, heldout = testbed4.addition_rows(max_operand, heldout_pairs, seed)
    return [_regex_row(r, template) for r in train], [_regex_row(r, template) for r in heldout]


def _regex_row(row: dict[str, Any], template: str) -> dict[str, Any]:
    a, b = row["a"], row["b"]
    return {
        "id": row["id"],
        "prompt": template.format(a=a, b=b),
        "answer": pattern(a + b),
        "verifier": "regex",
        "a": a,
        "b": b,
        "sum": a + b,
    }


def pilot_rows(train: Sequence[dict[str, Any]], n: int = PILOT_PROMPTS) -> list[dict[str, Any]]:
    """The pilot's training prompts: a fixed draw (seed 100, as the pilot's runs)."""
    return random.Random(PILOT_SEED).sample(list(train), n)


@dataclass(frozen=True)
class DataFiles:
    train: Path
    heldout: Path
    pilot: Path


def write_data(folder: Path = DATA) -> DataFiles:
    """The study's files (JSONL), written once and committed; rewritten only if their content would change."""
    folder.mkdir(parents=True, exist_ok=True)
    train, heldout = addition_rows()
    files = DataFiles(folder / "train.jsonl", folder / "heldout.jsonl", folder / "pilot_prompts.jsonl")
    for path, rows in ((files.train, train), (files.heldout, heldout), (files.pilot, pilot_rows(train))):
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return files


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ---------------------------------------------------------------- pilot decisions (pure rules)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class CutSample:
    """One pilot response as it would be at one cap: its group (prompt), length, whether the cap cut it, and
    the verifier's verdict on what is left."""

    group: str
    length: int
    cut: bool
    correct: bool


@dataclass(frozen=True)
class CapStats:
    cap: int
    accuracy: float
    mixed_frac: float  # groups with right and wrong responses
    truncated_frac: float
    cut_accepted_frac: float  # cut responses the verifier still accepts (expected ~0); NaN when none is cut
    residual: float  # over mixed groups: mean |l- - l+| / (l- + l+); NaN without a mixed group

    def gates(self) -> dict[str, bool]:
        return {
            "accuracy": GATE_ACCURACY[0] <= self.accuracy <= GATE_ACCURACY[1],
            "mixed": self.mixed_frac >= GATE_MIXED,
            "residual": math.isfinite(self.residual) and self.residual >= GATE_RESIDUAL,
            "truncation": GATE_TRUNCATION[0] <= self.truncated_frac <= GATE_TRUNCATION[1],
        }

    @property
    def passes(self) -> bool:
        return all(self.gates().values())


def cap_stats(cap: int, samples: Sequence[CutSample]) -> CapStats:
    if not samples:
        raise ValueError(f"cap {cap}: no samples to measure")
    groups: dict[str, list[CutSample]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    residuals, mixed = [], 0
    for members in groups.values():
        right = [s.length for s in members if s.correct]
        wrong = [s.length for s in members if not s.correct]
        if right and wrong:
            mixed += 1
            lp, ln = float(np.mean(right)), float(np.mean(wrong))
            residuals.append(abs(ln - lp) / (ln + lp) if ln + lp > 0 else 0.0)
    cut = [s for s in samples if s.cut]
    return CapStats(
        cap=cap,
        accuracy=sum(s.correct for s in samples) / len(samples),
        mixed_frac=mixed / len(groups),
        truncated_frac=len(cut) / len(samples),
        cut_accepted_frac=sum(s.correct for s in cut) / len(cut) if cut else math.nan,
        residual=float(np.mean(residuals)) if residuals else math.nan,
    )


@dataclass(frozen=True)
class CapDecision:
    """Pilot step 2: the cap that passes the four gates with truncation closest to 35% (ties: the smaller
    cap, the cheaper run); None when no candidate passes (then no study run starts)."""

    date: str
    cap: int | None
    base_accuracy: float  # training accuracy of the base model at the chosen cap: S1's `base`
    stats: tuple[CapStats, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CapDecision:
        return cls(d["date"], d["cap"], d["base_accuracy"], tuple(CapStats(**s) for s in d["stats"]))


def decide_cap(stats: Sequence[CapStats], date: str | None = None) -> CapDecision:
    passing = [s for s in stats if s.passes]
    best = min(passing, key=lambda s: (abs(s.truncated_frac - TRUNCATION_TARGET), s.cap), default=None)
    return CapDecision(
        date or _now(),
        best.cap if best else None,
        best.accuracy if best else math.nan,
        tuple(sorted(stats, key=lambda s: s.cap)),
    )


def gap_share(gaps: Sequence[float], lengths: Sequence[float]) -> float:
    """Mean |l- - l+| over the steps that have both kinds, divided by the mean response length over the same
    window: how open the right/wrong length gap is that GRPO's 1/|o_i| feeds on."""
    g = np.asarray([x for x in gaps if math.isfinite(x)], dtype=float)
    ln = np.asarray([x for x in lengths if math.isfinite(x)], dtype=float)
    return float(np.abs(g).mean() / ln.mean()) if g.size and ln.size else math.nan


@dataclass(frozen=True)
class LrTrial:
    """One 40-step cp_grpo pilot run, read at step 30 (the mean of steps 26-30)."""

    lr: float
    entropy: float  # diag/d7_entropy_mean
    truncated_frac: float  # response/truncated_frac: the original second gate, recorded; gates nothing now
    length_gap: float  # gap_share over the window: the second gate since the amendment of 2026-11-28

    @property
    def passes(self) -> bool:
        return self.entropy >= LR_MIN_ENTROPY and self.length_gap >= GAP_SHARE_MIN


@dataclass(frozen=True)
class LrDecision:
    """Pilot step 3: the higher passing rate; with none, the 3e-6 run is next (`lr` None, `next_lr` set);
    with 3e-6 tried and failed too, None and no next run (no study run starts)."""

    date: str
    lr: float | None
    next_lr: float | None
    trials: tuple[LrTrial, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LrDecision:
        return cls(d["date"], d["lr"], d["next_lr"], tuple(LrTrial(**t) for t in d["trials"]))


def decide_lr(trials: Sequence[LrTrial], date: str | None = None) -> LrDecision:
    tried = {t.lr for t in trials}
    missing = [lr for lr in PILOT_LRS if lr not in tried]
    if missing:
        raise ValueError(f"the learning-rate rule needs runs at {', '.join(f'{x:g}' for x in PILOT_LRS)}")
    passing = [t.lr for t in trials if t.passes]
    chosen = max(passing) if passing else None
    next_lr = FALLBACK_LR if chosen is None and FALLBACK_LR not in tried else None
    return LrDecision(date or _now(), chosen, next_lr, tuple(trials))


def lr_trial(lr: float, metrics: Sequence[dict[str, Any]]) -> LrTrial:
    """A pilot run's numbers at step 30 from its per-step metrics."""
    lo, hi = LR_WINDOW
    window = [m for m in metrics if lo <= m.get("step", -1) <= hi]

    def values(key: str) -> list[float]:
        return [as_float(m.get(key)) for m in window]

    def mean(key: str) -> float:
        finite = [v for v in values(key) if math.isfinite(v)]
        return float(np.mean(finite)) if finite else math.nan

    gaps = [
        n - p for n, p in zip(values("diag/d11_len_neg_mean"), values("diag/d11_len_pos_mean"), strict=True)
    ]
    return LrTrial(
        lr,
        mean("diag/d7_entropy_mean"),
        mean("response/truncated_frac"),
        gap_share(gaps, values("response/length_mean")),
    )


@dataclass(frozen=True)
class BudgetDecision:
    """Pilot step 4: the study's predicted time from the pilot's measured parts; over 10 h for 12 runs of
    100 steps, the study is cut to 5 seeds x 80 steps."""

    date: str
    step_s: float  # median step time, steps 11-40 of the chosen rate's run
    eval_s: float  # one 128-prompt evaluation (1 greedy + 4 samples)
    probe_s: float  # probes of one checkpoint
    final_eval_s: float  # the greedy evaluation of every held-out row
    startup_s: float  # Ray, vLLM and the learner coming up, per job
    full_hours: float
    cut: bool

    @property
    def design(self) -> Design:
        return CUT if self.cut else FULL

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BudgetDecision:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def run_seconds(design: Design, step_s: float, eval_s: float, probe_s: float, final_s: float, start_s: float):
    """One run's predicted seconds: steps, an evaluation every 10 steps, probes at the named steps, the
    final evaluation (its own job: a second start-up)."""
    evals = design.steps // EVAL_EVERY + 1
    return design.steps * step_s + evals * eval_s + len(design.named_evals) * probe_s + final_s + 2 * start_s


def decide_budget(
    step_s: float,
    eval_s: float,
    probe_s: float,
    final_eval_s: float,
    startup_s: float,
    date: str | None = None,
) -> BudgetDecision:
    full = (
        len(OBJECTIVES)
        * len(FULL.seeds)
        * run_seconds(FULL, step_s, eval_s, probe_s, final_eval_s, startup_s)
    )
    hours = full / 3600
    return BudgetDecision(
        date or _now(), step_s, eval_s, probe_s, final_eval_s, startup_s, hours, hours > BUDGET_HOURS
    )


class NoPilotDecision(RuntimeError):
    """The study's specs need the pilot's recorded decisions."""


@dataclass(frozen=True)
class Decisions:
    cap: int
    base_accuracy: float
    lr: float
    design: Design


def _read(folder: Path, name: str) -> dict[str, Any] | None:
    path = Path(folder) / name
    return json.loads(path.read_text()) if path.exists() else None


def load_decisions(folder: Path = DATA) -> Decisions:
    """The pilot's three decisions; NoPilotDecision naming what is missing and the command that records it."""
    cap, lr, budget = (_read(folder, n) for n in (CAP_FILE, LR_FILE, BUDGET_FILE))
    where = Path(folder)
    if cap is None or lr is None or budget is None:
        missing = [n for n, d in ((CAP_FILE, cap), (LR_FILE, lr), (BUDGET_FILE, budget)) if d is None]
        raise NoPilotDecision(
            f"no pilot decision recorded ({', '.join(missing)} missing in {where}): run `{PILOT_COMMAND}` "
            "first (testbed5_plan.md, 'Pilot'; no study run starts before it)"
        )
    c, r = CapDecision.from_json(cap), LrDecision.from_json(lr)
    if c.cap is None:
        raise NoPilotDecision(
            f"{where / CAP_FILE}: no candidate cap passed the four gates; the plan says amend the prompt or the "
            "operand range (dated, under Amendments) and rerun the pilot's step 1"
        )
    if r.lr is None:
        raise NoPilotDecision(
            f"{where / LR_FILE}: no learning rate passed; "
            + (f"run `{PILOT_COMMAND}` (next: {r.next_lr:g})" if r.next_lr else "the plan must be amended")
        )
    return Decisions(c.cap, c.base_accuracy, r.lr, BudgetDecision.from_json(budget).design)


def pilot_stop(folder: Path = DATA) -> str | None:
    """Where a recorded decision stopped the pilot before any study run (the plan's words, with the measured
    numbers), or None while it has not: the report says this instead of "not recorded"."""
    cap = _read(folder, CAP_FILE)
    if cap is not None and cap["cap"] is None:
        stats = [CapStats(**s) for s in cap["stats"]]
        return (
            f"the pilot's step 1 found no response cap passing the four gates (`results/testbed5/{CAP_FILE}`: "
            f"base accuracy at most {max(s.accuracy for s in stats):.3f}, mixed groups at most "
            f"{max(s.mixed_frac for s in stats):.3f} over the caps {', '.join(str(s.cap) for s in stats)}); "
            "the plan says the prompt wording or the operand range is amended (dated) and step 1 rerun before "
            "any study run"
        )
    lr = _read(folder, LR_FILE)
    if lr is not None and lr["lr"] is None and lr["next_lr"] is None:
        return (
            f"no learning rate passed the pilot's step 3 (`results/testbed5/{LR_FILE}`); the plan must be amended "
            "before any study run"
        )
    return None


def write_decision(decision: Any, folder: Path, name: str) -> Path:
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(decision), indent=1, allow_nan=True) + "\n")
    return path


# ---------------------------------------------------------------- job specs


def run_name(objective: str, seed: int) -> str:
    return f"tb5-{objective}-s{seed}".replace("_", "-")


def run_order(seeds: Sequence[int]) -> list[tuple[str, int]]:
    """Alternating arms, seed by seed: grpo s0, cp_grpo s0, grpo s1, ... (a part-done study is balanced)."""
    return [(objective, seed) for seed in seeds for objective in OBJECTIVES]


def _base_spec(
    name: str, objective: str, seed: int, steps: int, cap: int, lr: float, files: DataFiles
) -> dict[str, Any]:
    return {
        "name": name,
        "model": MODEL,
        "task": {
            "name": "dataset",
            "params": {"path": str(files.train), "id_column": "id"},
            "reward_workers": 1,
        },
        "objective": {"name": objective},
        "group_size": GROUP_SIZE,
        "prompts_per_step": PROMPTS_PER_STEP,
        "steps": steps,
        "seed": seed,
        "sampling": {"temperature": TEMPERATURE, "max_new_tokens": cap},
        "optim": {"lr": lr, "micro_batch_size": MICRO_BATCH},
        "resources": {"learner_ranks": 1, "rollout_replicas": 1, "rollout_engine": "vllm"},
    }


def _periodic_eval(files: DataFiles, every: int) -> dict[str, Any]:
    """The 128-prompt evaluation: 1 greedy answer + 4 samples at the training temperature (cap as in training)."""
    return {
        "dataset": {"path": str(files.heldout), "id_column": "id"},
        "every_steps": every,
        "samples_per_prompt": EVAL_SAMPLES,
        "greedy": False,
        "also_greedy": True,
        "temperature": TEMPERATURE,
        "max_prompts": EVAL_PROMPTS,
    }


def job_spec(
    objective: str, seed: int, decisions: Decisions, files: DataFiles | None = None
) -> dict[str, Any]:
    """One study run's spec (valid for `JobSpec.parse`): the pilot's cap and rate, an evaluation and a
    checkpoint every 10 steps (the probes read the checkpoints; a killed run resumes from the newest)."""
    files = files or write_data()
    steps = decisions.design.steps
    return {
        **_base_spec(run_name(objective, seed), objective, seed, steps, decisions.cap, decisions.lr, files),
        "eval": _periodic_eval(files, EVAL_EVERY),
        "checkpoint": {"every_steps": EVAL_EVERY, "keep_last": 1 + steps // EVAL_EVERY},
    }


def final_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The eval-only job on a run's final checkpoint: one greedy answer to every held-out row."""
    return {
        **{k: v for k, v in spec.items() if k not in ("eval", "checkpoint")},
        "name": spec["name"] + "-final",
        "steps": 0,
        "eval": {"dataset": spec["eval"]["dataset"], "greedy": True, "max_prompts": 100_000},
    }


def study_specs(
    decisions: Decisions | None = None, seeds: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Every study run's spec in run order; refused (NoPilotDecision) before the pilot has decided."""
    decisions = decisions or load_decisions()
    chosen = decisions.design.seeds if seeds is None else seeds
    outside = sorted(set(chosen) - set(decisions.design.seeds))
    if outside:
        raise ValueError(
            f"--seeds {','.join(map(str, outside))}: not in the study's seeds "
            f"{','.join(map(str, decisions.design.seeds))}"
        )
    return [job_spec(o, s, decisions) for o, s in run_order(chosen)]


def pilot_sampling_spec(files: DataFiles) -> dict[str, Any]:
    """Pilot step 1: 64 training prompts x 8 samples at T = 0.7 with a 256-token cap, as an eval-only job (the
    project's engine and reward pool; each sample's text and token count land in eval/step_0.jsonl)."""
    return _sampling_spec("tb5-pilot-base", files.pilot, PILOT_PROMPTS, files)


def _sampling_spec(name: str, prompts: Path, n: int, files: DataFiles) -> dict[str, Any]:
    """An eval-only job sampling the base model: the first `n` rows of `prompts` x 8 at T = 0.7, 256 tokens."""
    return {
        **_base_spec(name, "cp_grpo", PILOT_SEED, 0, PILOT_SAMPLING_CAP, PILOT_LRS[0], files),
        "eval": {
            "dataset": {"path": str(prompts), "id_column": "id"},
            "greedy": False,
            "samples_per_prompt": PILOT_SAMPLES,
            "temperature": TEMPERATURE,
            "max_prompts": n,
        },
    }


def pilot_lr_name(lr: float) -> str:
    return f"tb5-pilot-cp-grpo-lr{lr:g}"


def pilot_lr_spec(lr: float, cap: int, files: DataFiles) -> dict[str, Any]:
    """Pilot step 3: a 40-step cp_grpo run (seed 100); evaluated at the start and the end only, which times
    one evaluation for the budget."""
    return {
        **_base_spec(pilot_lr_name(lr), "cp_grpo", PILOT_SEED, LR_STEPS, cap, lr, files),
        "eval": _periodic_eval(files, 0),
        "checkpoint": {"every_steps": 0, "keep_last": 1},
    }


# ---------------------------------------------------------------- one run's summary


# testbed 4's curves and the shared-node and fork entropies (S3 and the exploratory fork entropy)
CURVES = (*testbed4.CURVES, "diag/d7_entropy_shared", "diag/d7_entropy_fork")
EVAL_KEYS = (
    "eval/accuracy",
    "eval/pass@4",
    "eval/greedy/accuracy",
    "eval/length_correct_mean",
    "eval/length_incorrect_mean",
    "eval/response_length_mean",
    "eval/truncated_frac",
    "timing/eval_s",
)
FINAL_KEYS = (
    "eval/accuracy",
    "eval/prompts",
    "eval/length_correct_mean",
    "eval/length_incorrect_mean",
    "eval/truncated_frac",
)


def summarise_run(
    metrics: Sequence[dict[str, Any]], probes: dict[int, dict[str, float]], final: dict[str, Any]
) -> dict[str, Any]:
    """One run's record: per-step curves, every evaluation (probes at the named steps) and the final one.
    The report's endpoints are computed from this, not stored in it."""
    trained = [m for m in metrics if m["step"] > 0 and "reward/accuracy" in m]
    evals = {
        int(m["step"]): {**{k: as_float(m.get(k)) for k in EVAL_KEYS}, **probes.get(int(m["step"]), {})}
        for m in metrics
        if "eval/accuracy" in m
    }
    return {
        "steps": [int(m["step"]) for m in trained],
        "curves": {k: [as_float(m.get(k)) for m in trained] for k in CURVES},
        "evals": {str(k): v for k, v in sorted(evals.items())},
        "final_eval": {k: as_float(final.get(k)) for k in FINAL_KEYS},
    }


def _train(spec_dict: dict[str, Any], run_dir: Path, resume: str | Path | None) -> str:
    from tgc_rl.config import JobSpec
    from tgc_rl.trainer.main import run as train

    state = train(JobSpec.parse(spec_dict), run_dir, resume=resume, progress=False)
    if state == "cancelled":  # Ctrl-C or SIGTERM stops the study or the pilot, not only this job
        raise SystemExit(130)
    return str(state)


def _samples(run_dir: Path, step: int) -> list[dict[str, Any]] | None:
    path = run_dir / "eval" / f"step_{step}.jsonl"
    return read_rows(path) if path.exists() else None


def run_one(
    spec_dict: dict[str, Any],
    design: Design,
    prober_for: Callable[[], Prober],
    cache: Path,
    log: Callable[[str], None],
) -> dict[str, Any] | None:
    """Train (or resume) one run, evaluate its final checkpoint on every held-out row, probe the named
    steps' checkpoints; its summary, or None when the run failed (checkpoints kept for a resume)."""
    from tgc_rl.run_layout import checkpoint_name, checkpoint_step
    from tgc_rl.trainer.checkpoints import Checkpoints

    name, steps = spec_dict["name"], spec_dict["steps"]
    run_dir = Path(cache) / "testbed5" / name
    ckpts = run_dir / "checkpoints"
    latest = Checkpoints(ckpts, spec_dict["checkpoint"]["keep_last"]).latest()
    log(f"{name}: {'resuming' if latest else 'starting'} ({steps} steps)")
    t0 = time.perf_counter()
    if latest is None or latest.name != checkpoint_name(steps):
        state = _train(spec_dict, run_dir, "latest" if latest else None)
        if state != "succeeded":
            log(f"{name}: {state}; checkpoints kept for a resume")
            return None
    final_dir = run_dir / "final"
    if not (final_dir / "eval" / "step_0.jsonl").exists():
        state = _train(final_spec(spec_dict), final_dir, ckpts / checkpoint_name(steps))
        if state != "succeeded":
            log(f"{name}: final evaluation {state}; checkpoints kept for a resume")
            return None
    seconds = time.perf_counter() - t0
    final = read_metrics(final_dir)[-1]
    metrics = read_metrics(run_dir)
    prober = prober_for()
    t1 = time.perf_counter()
    probes: dict[int, dict[str, float]] = {}
    for m in metrics:  # every evaluation: the answers' forms and opening (exploratory; no model needed)
        if "eval/accuracy" in m and (samples := _samples(run_dir, int(m["step"]))):
            probes[int(m["step"])] = {
                **format_metrics(samples),
                "opening/top_share": opening_share(samples, prober.tok),
            }
    for step in design.named_evals:
        path = base_model_path() if step == 0 else ckpts / checkpoint_name(step) / "model"
        probes[step] = {**probes.get(step, {}), **prober.probe(path, _samples(run_dir, step))}
    summary = {
        **summarise_run(metrics, probes, final),
        "name": name,
        "objective": spec_dict["objective"]["name"],
        "seed": spec_dict["seed"],
        "lr": spec_dict["optim"]["lr"],
        "cap": spec_dict["sampling"]["max_new_tokens"],
        "named_evals": list(design.named_evals),
        # this process's seconds (since the resume, for a resumed run); train_seconds: the steps' and the
        # evaluations' own times, from every session's metrics rows
        "seconds": seconds,
        "resumed_from_step": None if latest is None else checkpoint_step(latest.name),
        "train_seconds": sum(
            m[k]
            for m in metrics
            for k in ("timing/step_s", "timing/eval_s")
            if math.isfinite(as_float(m.get(k)))
        ),
        "probe_seconds": time.perf_counter() - t1,
        "spec": spec_dict,
    }
    shutil.rmtree(ckpts, ignore_errors=True)  # ~1.3 GB each with AdamW moments
    return summary


OPENING_TOKENS = 4


def opening_share(samples: Sequence[dict[str, Any]], tokenizer) -> float:
    """The share of the sampled answers that begin with the most common first four tokens (how far the runs
    have settled on one form; testbed 4's collapse). NaN without sampled answers."""
    openings = Counter(
        tuple(tokenizer(s["response"], add_special_tokens=False)["input_ids"][:OPENING_TOKENS])
        for s in samples
        if s.get("mode", "sampled") == "sampled"
    )
    total = sum(openings.values())
    return openings.most_common(1)[0][1] / total if total else math.nan


def make_prober(files: DataFiles | None = None) -> Prober:
    """Testbed 4's prober on testbed 5's held-out rows (its phrasings need the plain sum as `answer`)."""
    from tgc_rl.config import ModelSpec
    from tgc_rl.models import load_tokenizer

    files = files or write_data()
    rows = [{**r, "answer": str(r["sum"])} for r in read_rows(files.heldout)]
    return Prober(base_model_path(), load_tokenizer(ModelSpec.model_validate(MODEL)), rows)


# ---------------------------------------------------------------- heavy work: one job at a time


class _Heavy:
    """Ray for the jobs of a study or pilot, each job under `lock` (one heavy job at a time on a shared
    machine); Ray is shut down at the end if this started it."""

    def __init__(self, lock: Path | None, log: Callable[[str], None]):
        self.lock, self.log, self.started = lock, log, False

    def run(self, label: str, work: Callable[[], Any]) -> Any:
        import fcntl

        import ray

        with open(self.lock or "/dev/null", "a+") as held:
            if self.lock is not None:
                self.log(f"{label}: waiting for {self.lock}")
                fcntl.flock(held, fcntl.LOCK_EX)
            if not ray.is_initialized():
                ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
                self.started = True
            return work()

    def close(self) -> None:
        if self.started:
            import ray

            ray.shutdown()


def _commit(paths: Sequence[Path], message: str) -> None:
    subprocess.run(["git", "add", *map(str, paths)], check=True)
    subprocess.run(["git", "commit", "-q", "-m", message, "--", *map(str, paths)], check=True)


def run_study(
    seeds: Sequence[int] | None = None,
    out: Path = RUNS,
    cache: Path = CACHE,
    commit: bool = False,
    lock: Path | None = None,
    log: Callable[[str], None] = print,
    decisions: Decisions | None = None,
) -> list[Path]:
    """The study's runs in order, skipping those with a summary in `out`; refused before the pilot decided."""
    decisions = decisions or load_decisions()
    specs = study_specs(decisions, seeds)
    out.mkdir(parents=True, exist_ok=True)
    heavy, written = _Heavy(lock, log), []
    prober: Prober | None = None

    def get_prober() -> Prober:
        nonlocal prober
        prober = prober or make_prober()
        return prober

    try:
        for spec in specs:
            path = out / f"{spec['name']}.json"
            if path.exists():
                log(f"{spec['name']}: done before ({path.name})")
                continue
            summary = heavy.run(
                spec["name"], lambda s=spec: run_one(s, decisions.design, get_prober, cache, log)
            )
            if summary is None:
                continue
            path.write_text(json.dumps(summary, indent=1, allow_nan=True))
            log(f"{spec['name']}: {summary['seconds']:.0f}s + probes {summary['probe_seconds']:.0f}s")
            written.append(path)
            if commit:
                _commit([path], f"Testbed 5: run {spec['name']}")
    finally:
        heavy.close()
    return written


# ---------------------------------------------------------------- the pilot (measuring parts)


def cut_samples(
    samples: Sequence[dict[str, Any]], cap: int, items: dict[str, Any], tokenizer
) -> list[CutSample]:
    """The pilot's responses as they would be at `cap` (sampling at cap c gives the same first c tokens),
    re-scored by the rows' own verifier: a response longer than the cap keeps its first `cap` tokens
    (re-tokenised from its text) and is marked cut."""
    from tgc_rl.tasks.dataset import score_row

    out = []
    for s in samples:
        text, cut = s["response"], s["tokens"] > cap
        if cut:
            text = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"][:cap])
        score = score_row(items[s["row"]], text, lambda *_: None)
        out.append(CutSample(s["row"], min(s["tokens"], cap), cut, score.reward > 0))
    return out


def dataset_items(path: Path) -> dict[str, Any]:
    """The rows of a study file as the dataset task loads them (the verifier the trainer uses), by row id."""
    from tgc_rl.tasks.dataset import DatasetParams, DatasetTask

    task = DatasetTask(role="all", params=DatasetParams(path=str(path), id_column="id"))
    return {item.meta["row"]: item for item in (task.eval_item(i) for i in range(len(task)))}


@dataclass
class _PilotContext:
    files: DataFiles
    folder: Path
    cache: Path
    heavy: _Heavy
    commit: bool
    log: Callable[[str], None]
    written: list[Path] = field(default_factory=list)

    def record(self, decision: Any, name: str, message: str) -> None:
        path = write_decision(decision, self.folder, name)
        self.written.append(path)
        self.log(f"pilot: {message} ({path})")
        if self.commit:
            _commit([path], f"Testbed 5 pilot: {message}")


INPUTS_FILE = "harness_inputs.json"


def _job_inputs(spec: dict[str, Any], *files: Path) -> str:
    """What a pilot job's cached results depend on: its spec and the content of the data files it reads (an
    amended prompt or operand range rewrites a file under the same path)."""
    digests = {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in files}
    return json.dumps({"spec": spec, "files": digests}, sort_keys=True)


def _cached(run_dir: Path, inputs: str) -> bool:
    """A finished pilot job in `run_dir` ran on these inputs (else it is rerun from scratch)."""
    path = run_dir / INPUTS_FILE
    return path.exists() and path.read_text() == inputs


def _pilot_cap(ctx: _PilotContext) -> CapDecision:
    from tgc_rl.config import ModelSpec
    from tgc_rl.models import load_tokenizer

    spec = pilot_sampling_spec(ctx.files)
    samples = _base_samples(ctx.heavy, spec, ctx.cache / "testbed5" / spec["name"], ctx.files.pilot)
    tokenizer = load_tokenizer(ModelSpec.model_validate(MODEL))
    decision = decide_cap(candidate_stats(samples, dataset_items(ctx.files.pilot), tokenizer))
    chosen = (
        f"response cap {decision.cap} (base accuracy {decision.base_accuracy:.3f})"
        if decision.cap
        else "no response cap passes the four gates"
    )
    ctx.record(decision, CAP_FILE, chosen)
    return decision


def _base_samples(heavy: _Heavy, spec: dict[str, Any], run_dir: Path, prompts: Path) -> list[dict[str, Any]]:
    """The sampled responses of an eval-only job on the base model, run unless done before on these inputs."""
    inputs = _job_inputs(spec, prompts)
    if not ((run_dir / "eval" / "step_0.jsonl").exists() and _cached(run_dir, inputs)):
        shutil.rmtree(run_dir, ignore_errors=True)
        state = heavy.run(spec["name"], lambda: _train(spec, run_dir, None))
        if state != "succeeded":
            raise RuntimeError(f"base-model sampling {state}: see {run_dir}")
        (run_dir / INPUTS_FILE).write_text(inputs)
    return [s for s in read_rows(run_dir / "eval" / "step_0.jsonl") if s["mode"] == "sampled"]


def candidate_stats(samples: Sequence[dict[str, Any]], items: dict[str, Any], tokenizer) -> list[CapStats]:
    """Pilot step 1's statistics: the responses cut at each candidate cap and re-scored."""
    return [cap_stats(c, cut_samples(samples, c, items, tokenizer)) for c in CANDIDATE_CAPS]


PILOT_RUNS = "pilot_runs"  # under the decisions' folder: one record per finished pilot lr run


@dataclass(frozen=True)
class PilotRun:
    """A finished pilot lr run as the decisions read it, kept in results (`PILOT_RUNS`/<job>.json) so that a
    later session, whose machine has none of this one's run directories, resumes after it."""

    trial: LrTrial
    metrics: list[dict[str, Any]]  # metrics.jsonl's rows
    wall_s: float  # the job's wall time, start-up included: the budget's input
    # the step-0 evaluation (the base model's answers): the timed probe's input
    base_samples: list[dict[str, Any]]


def _pilot_lr_run(ctx: _PilotContext, lr: float, cap: int) -> PilotRun:
    """The run from its record in results if one ran on these inputs, else from the cache's run directory if
    one finished there, else trained now; a new record is written (and committed with --commit) at once."""
    spec = pilot_lr_spec(lr, cap, ctx.files)
    inputs = _job_inputs(spec, ctx.files.train, ctx.files.heldout)
    record = ctx.folder / PILOT_RUNS / f"{spec['name']}.json"
    saved = json.loads(record.read_text()) if record.exists() else None
    if saved is None or saved["inputs"] != inputs:
        run_dir = ctx.cache / "testbed5" / spec["name"]
        wall = run_dir / "harness_wall_s.txt"
        if not (wall.exists() and _cached(run_dir, inputs)):
            shutil.rmtree(run_dir, ignore_errors=True)  # a killed attempt's steps would mix with the rerun's
            t0 = time.perf_counter()
            state = ctx.heavy.run(spec["name"], lambda: _train(spec, run_dir, None))
            if state != "succeeded":
                raise RuntimeError(f"pilot run {spec['name']} {state}: see {run_dir}")
            wall.write_text(f"{time.perf_counter() - t0}\n")
            (run_dir / INPUTS_FILE).write_text(inputs)
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # nothing reads them
        saved = {
            "inputs": inputs,
            "wall_s": float(wall.read_text()),
            "metrics": read_metrics(run_dir),
            "base_samples": _samples(run_dir, 0) or [],
        }
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(saved, allow_nan=True) + "\n")
        ctx.written.append(record)
        ctx.log(f"pilot: run {spec['name']} recorded ({record})")
        if ctx.commit:
            _commit(
                [record], f"Testbed 5 pilot: the run {spec['name']} ({len(saved['metrics'])} metric rows)"
            )
    metrics = saved["metrics"]
    return PilotRun(lr_trial(lr, metrics), metrics, saved["wall_s"], saved["base_samples"])


def run_pilot(
    cache: Path = CACHE,
    folder: Path = DATA,
    commit: bool = False,
    lock: Path | None = None,
    log: Callable[[str], None] = print,
) -> list[Path]:
    """The pilot's steps not yet decided, in order (a recorded decision is not redone); stops where the plan
    says no study run may start. Returns the decision files written."""
    ctx = _PilotContext(write_data(), Path(folder), Path(cache), _Heavy(lock, log), commit, log)
    try:
        cap_d = _read(folder, CAP_FILE)
        cap = CapDecision.from_json(cap_d) if cap_d else _pilot_cap(ctx)
        if cap.cap is None:
            log("pilot: no cap passes the four gates; amend the prompt or operand range (dated) and rerun")
            return ctx.written
        runs: dict[float, PilotRun] = {}
        lr_d = _read(folder, LR_FILE)
        decision = LrDecision.from_json(lr_d) if lr_d else None
        while decision is None or (decision.lr is None and decision.next_lr is not None):
            todo = [decision.next_lr] if decision is not None else list(PILOT_LRS)
            for lr in todo:
                if lr is not None:
                    runs[lr] = _pilot_lr_run(ctx, lr, cap.cap)
            trials = (decision.trials if decision else ()) + tuple(
                runs[lr].trial for lr in todo if lr is not None
            )
            decision = decide_lr(trials)
            ctx.record(
                decision, LR_FILE, f"learning rate {decision.lr:g}" if decision.lr else "no rate passes"
            )
        if decision.lr is None:
            log("pilot: no learning rate passes; the plan must be amended before any study run")
            return ctx.written
        if _read(folder, BUDGET_FILE) is None:
            budget = _measure_budget(ctx, runs.get(decision.lr) or _pilot_lr_run(ctx, decision.lr, cap.cap))
            ctx.record(budget, BUDGET_FILE, "cut to 5 seeds x 80 steps" if budget.cut else "the full study")
            if budget.cut:
                _amend_plan(budget)
                if commit:
                    _commit([PLAN_FILE], "Testbed 5 plan: amendment, the budget rule cuts the study")
    finally:
        ctx.heavy.close()
    return ctx.written


def _measure_budget(ctx: _PilotContext, run: PilotRun) -> BudgetDecision:
    """The budget rule's inputs from the chosen rate's pilot run, and one probe timed here."""
    metrics, wall_s = run.metrics, run.wall_s
    steps = [as_float(m.get("timing/step_s")) for m in metrics if 11 <= m.get("step", 0) <= LR_STEPS]
    step_s = float(np.nanmedian(steps)) if steps else math.nan
    evals = [as_float(m.get("timing/eval_s")) for m in metrics if "eval/accuracy" in m]
    eval_s = float(np.nanmean(evals)) if evals else math.nan
    t0 = time.perf_counter()
    make_prober(ctx.files).probe(base_model_path(), run.base_samples)
    probe_s = time.perf_counter() - t0  # prober set-up included: each run builds one
    # The final evaluation answers every held-out row once, greedily: ~500 of the 128 x 5 responses of one
    # periodic evaluation.
    final_s = eval_s * len(read_rows(ctx.files.heldout)) / (EVAL_PROMPTS * (EVAL_SAMPLES + 1))
    all_steps = [as_float(m.get("timing/step_s")) for m in metrics if m.get("step", 0) > 0]
    startup_s = max(0.0, wall_s - sum(v for v in all_steps if math.isfinite(v)) - sum(evals))
    return decide_budget(step_s, eval_s, probe_s, final_s, startup_s)


def _amend_plan(budget: BudgetDecision) -> None:
    """Rule 4 says the cut is recorded under Amendments before any study run: a dated line, appended."""
    text = PLAN_FILE.read_text()
    line = (
        f"- {budget.date[:10]} (pilot, rule 4): the pilot's measured parts predict {budget.full_hours:.1f} h for "
        f"12 runs of 100 steps (> {BUDGET_HOURS:g} h): the study is cut to 5 seeds x 80 steps (seeds 0-4; "
        "evaluations read at 0, 10, 20, 30, 40, 60, 80; the final evaluation at step 80). Numbers: "
        f"`results/testbed5/{BUDGET_FILE}`.\n"
    )
    text = text.replace("## Amendments\n\nNone yet.\n", "## Amendments\n\n")
    PLAN_FILE.write_text(text.rstrip("\n") + "\n" + line)


# ---------------------------------------------------------------- exploratory: a wording probe (not a pilot step)


@dataclass(frozen=True)
class Wording:
    name: str
    template: str
    max_operand: int


EXAMPLE = "Example: for 23 + 45, write: Add the tens: 20 + 40 = 60. Add the ones: 3 + 5 = 8. 60 + 8 = 68. Answer: 68"
# Round 1, after the first step 1 failed (the base model rarely ends in "Answer: <right sum>"): a worked
# example after the question, the same on operands 0-49, and the example first with the question last.
# Round 2, after round 1 (the example is copied, "Answer: 68", and adds no right sums): operands 0-49 with the
# first wording, with an "a + b = <number>" line asked for, and with the instruction repeated at the end.
PROBE_ROUNDS: dict[int, tuple[Wording, ...]] = {
    1: (
        Wording("example", FIRST_TEMPLATE + " " + EXAMPLE, 99),
        Wording("example-0-49", FIRST_TEMPLATE + " " + EXAMPLE, 49),
        Wording(
            "example-first",
            EXAMPLE + "\nNow do the same for {a} + {b}: explain your steps briefly, then finish with "
            "'Answer: <number>'.",
            99,
        ),
    ),
    2: (
        Wording("plain-0-49", FIRST_TEMPLATE, 49),
        Wording(
            "equation-0-49",
            "What is {a} + {b}? Write {a} + {b} = <number>, explain your steps briefly, then finish with "
            "'Answer: <number>'.",
            49,
        ),
        Wording("repeat-0-49", REPEAT_TEMPLATE, 49),
    ),
}
PROBE_PROMPTS = 32


def probe_names(round_: int) -> tuple[str, str]:
    """(the probe job's name, its result file) for a round."""
    suffix = "" if round_ == 1 else f"-{round_}"
    return f"tb5-probe-wordings{suffix}", f"probe_wordings{suffix.replace('-', '_')}.json"


def probe_rows(wording: Wording, n: int = PROBE_PROMPTS) -> list[dict[str, Any]]:
    """The first `n` of the pilot's draw from the wording's training rows, ids prefixed by the wording."""
    train, _ = addition_rows(wording.max_operand, template=wording.template)
    return [{**r, "id": f"{wording.name}/{r['id']}"} for r in pilot_rows(train)[:n]]


def run_probe(
    round_: int,
    wordings: Sequence[Wording] | None = None,
    cache: Path = CACHE,
    folder: Path = DATA,
    lock: Path | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Exploratory, before a rerun of pilot step 1: each wording's prompts sampled as step 1 samples (one
    eval-only job for all: 8 samples at T = 0.7, 256 tokens) and measured at the candidate caps as step 1
    measures (`candidate_stats`, `decide_cap`). Decides nothing; writes `results/testbed5/probe_wordings*.json`
    (`probe_names`). `wordings`: the round's unless given."""
    from tgc_rl.config import ModelSpec
    from tgc_rl.models import load_tokenizer

    if wordings is None:
        if round_ not in PROBE_ROUNDS:
            raise ValueError(f"probe round {round_}: unknown (rounds: {', '.join(map(str, PROBE_ROUNDS))})")
        wordings = PROBE_ROUNDS[round_]
    job, result = probe_names(round_)
    files = write_data()
    run_dir = Path(cache) / "testbed5" / job
    prompts = run_dir.parent / f"{job}-prompts.jsonl"  # outside run_dir: a rerun clears that
    rows = [r for w in wordings for r in probe_rows(w)]
    prompts.parent.mkdir(parents=True, exist_ok=True)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = _sampling_spec(run_dir.name, prompts, len(rows), files)
    heavy = _Heavy(lock, log)
    t0 = time.perf_counter()
    try:
        samples = _base_samples(heavy, spec, run_dir, prompts)
    finally:
        heavy.close()
    tokenizer = load_tokenizer(ModelSpec.model_validate(MODEL))
    items = dataset_items(prompts)
    results = []
    for w in wordings:
        mine = [s for s in samples if s["row"].startswith(w.name + "/")]
        decision = decide_cap(candidate_stats(mine, items, tokenizer))
        results.append(
            {
                **asdict(w),
                "samples": len(mine),
                "mean_tokens": float(np.mean([s["tokens"] for s in mine])),
                "decision": asdict(decision),
            }
        )
        log(
            f"probe {w.name}: cap {decision.cap}, accuracy by cap {[round(s.accuracy, 3) for s in decision.stats]}"
        )
    path = Path(folder) / result
    record = {
        "date": _now(),
        "round": round_,
        "exploratory": "not a pilot step: a wording probe before pilot step 1 is rerun (testbed5_plan.md)",
        "prompts_per_wording": PROBE_PROMPTS,
        "samples_per_prompt": PILOT_SAMPLES,
        "temperature": TEMPERATURE,
        "sampling_cap": PILOT_SAMPLING_CAP,
        "seconds": time.perf_counter() - t0,
        "wordings": results,
    }
    path.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n")
    return path


if __name__ == "__main__":  # the exploratory probe: python -m experiments.testbed5 probe --lock FILE
    import argparse

    parser = argparse.ArgumentParser(prog="python -m experiments.testbed5")
    parser.add_argument("action", choices=("probe",), help="probe: the exploratory wording probe")
    parser.add_argument("--lock", type=Path, default=None, help="hold this file's lock while the job runs")
    parser.add_argument("--cache", type=Path, default=CACHE, help="run directories")
    parser.add_argument("--round", type=int, default=max(PROBE_ROUNDS), help="which round's wordings")
    args = parser.parse_args()
    print(f"probe: {run_probe(args.round, cache=args.cache, lock=args.lock)}")
