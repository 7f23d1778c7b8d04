"""Testbed 5's section of REPORT.md, from the committed run summaries (`results/testbed5_runs/*.json`) and the
pilot's decisions (`results/testbed5/pilot_*.json`): the manipulation check first, then the primary endpoint
and the four Holm-adjusted secondaries exactly as `testbed5_plan.md` defines them. Every number is recomputed
from the per-step curves and evaluations in the summaries by `experiments.stats`."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.stats import Comparison, compare, direction, holm, summarize
from experiments.testbed5 import (
    DATA,
    FULL,
    GAP_SHARE_MIN,
    MAX_OPERAND,
    PILOT_COMMAND,
    Decisions,
    NoPilotDecision,
    gap_share,
    load_decisions,
    pilot_stop,
    run_name,
)
from rlcore import RESIDUAL_TOLERANCE

ALPHA = 0.05
MANIP_D2 = 0.05  # grpo's mean D2 over steps 1-50, in all seeds but one
EARLY = (1, 50)
PRIMARY_FROM = 21
EFFECT_OF_INTEREST = 0.10  # of the cap, in tokens
S1_GAIN = 0.2
S3_WINDOW = (10, 40)
S4_FLOOR = 0.05
GREEDY = "eval/greedy/accuracy"


@dataclass(frozen=True)
class Run:
    """One finished run's summary (as `testbed5.summarise_run` wrote it) with its per-step curves by step."""

    name: str
    objective: str
    seed: int
    cap: int
    steps: tuple[int, ...]
    curves: dict[str, tuple[float, ...]]
    evals: dict[int, dict[str, float]]
    final_accuracy: float

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Run:
        return cls(
            d["name"],
            d["objective"],
            int(d["seed"]),
            int(d["cap"]),
            tuple(d["steps"]),
            {k: tuple(_f(v) for v in vs) for k, vs in d["curves"].items()},
            {int(s): {k: _f(v) for k, v in e.items()} for s, e in d["evals"].items()},
            _f(d["final_eval"].get("eval/accuracy")),
        )

    @property
    def last_step(self) -> int:
        return max(self.steps)

    def window(self, key: str, lo: int, hi: int) -> np.ndarray:
        """The curve's finite values on steps lo..hi (inclusive)."""
        values = np.asarray(
            [v for s, v in zip(self.steps, self.curves[key], strict=True) if lo <= s <= hi], dtype=float
        )
        return values[np.isfinite(values)]

    def gaps(self, lo: int, hi: int) -> np.ndarray:
        """Per step on lo..hi: negative- minus positive-advantage response length (steps with both kinds)."""
        pairs = [
            (n, p)
            for s, n, p in zip(
                self.steps,
                self.curves["diag/d11_len_neg_mean"],
                self.curves["diag/d11_len_pos_mean"],
                strict=True,
            )
            if lo <= s <= hi and math.isfinite(n) and math.isfinite(p)
        ]
        return np.asarray([n - p for n, p in pairs], dtype=float)


def _f(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def load_runs(runs_dir: Path) -> dict[str, list[Run]]:
    """The study's runs by arm, seed order (pilot runs and other names left out)."""
    out: dict[str, list[Run]] = {}
    for path in sorted(Path(runs_dir).glob("*.json")):
        d = json.loads(path.read_text())
        if d.get("name") == run_name(d["objective"], d["seed"]):
            out.setdefault(d["objective"], []).append(Run.from_json(d))
    return {arm: sorted(rs, key=lambda r: r.seed) for arm, rs in out.items()}


# ---------------------------------------------------------------- per-run measures (the plan's definitions)


def early_d2(run: Run) -> float:
    return _mean(run.window("diag/d2_residual", *EARLY))


def max_d2(run: Run) -> float:
    d2 = run.window("diag/d2_residual", 1, run.last_step)
    return float(d2.max()) if d2.size else math.nan


def early_gap_share(run: Run) -> float:
    """Mean |l- - l+| over steps 1-50 divided by the mean response length over those steps."""
    return gap_share(run.gaps(*EARLY), run.window("response/length_mean", *EARLY))


def primary(run: Run) -> float:
    """The length gap, negative- minus positive-advantage responses, mean over steps 21 to the last."""
    return _mean(run.gaps(PRIMARY_FROM, run.last_step))


def steps_to_gain(run: Run, base: float) -> float:
    """S1: the first step whose 10-step moving mean of training accuracy reaches base + 0.2 (never: the last
    step + 1)."""
    acc = np.asarray(run.curves["reward/accuracy"], dtype=float)
    for i in range(9, len(acc)):
        if np.nanmean(acc[i - 9 : i + 1]) >= base + S1_GAIN:
            return float(run.steps[i])
    return float(run.last_step + 1)


def late_accuracy(run: Run) -> float:
    """S2: greedy accuracy at steps 60 and 80 (128 prompts; those before the last step) and the final
    evaluation of every held-out row, which stands for the last step."""
    late = [run.evals.get(s, {}).get(GREEDY, math.nan) for s in (60, 80) if s < run.last_step]
    return float(np.mean([*late, run.final_accuracy]))


def shared_entropy(run: Run) -> float:
    """S3: the training metric diag/d7_entropy_shared, mean over steps 10-40."""
    return _mean(run.window("diag/d7_entropy_shared", *S3_WINDOW))


def learning_tax(run: Run) -> float:
    """S4: probe KL from the initial model at the last step per unit of greedy accuracy gained (floor 0.05)."""
    last, first = run.evals.get(run.last_step, {}), run.evals.get(0, {})
    gain = last.get(GREEDY, math.nan) - first.get(GREEDY, math.nan)
    return (
        last.get("probe/kl_from_start", math.nan) / max(gain, S4_FLOOR) if math.isfinite(gain) else math.nan
    )


# ---------------------------------------------------------------- the analysis


@dataclass(frozen=True)
class ManipulationCheck:
    grpo_d2: tuple[float, ...]  # per seed, mean over steps 1-50
    grpo_needed: int  # seeds that must reach MANIP_D2: all but one of the planned seeds
    cp_max_d2: float
    gap_share: dict[str, float]  # per arm, averaged over its seeds
    complete: bool  # every planned run is in

    @property
    def grpo_passing(self) -> int:
        return sum(v >= MANIP_D2 for v in self.grpo_d2)

    @property
    def holds(self) -> bool:
        return (
            self.complete
            and self.grpo_passing >= self.grpo_needed
            and self.cp_max_d2 <= RESIDUAL_TOLERANCE
            and all(self.gap_share.get(arm, math.nan) >= GAP_SHARE_MIN for arm in ("grpo", "cp_grpo"))
        )


def manipulation_check(runs: dict[str, list[Run]], planned_seeds: int) -> ManipulationCheck:
    grpo, cp = runs.get("grpo", []), runs.get("cp_grpo", [])
    cp_d2 = [max_d2(r) for r in cp]
    return ManipulationCheck(
        tuple(early_d2(r) for r in grpo),
        planned_seeds - 1,
        max(cp_d2) if cp_d2 else math.nan,
        {
            arm: float(np.mean([early_gap_share(r) for r in runs[arm]]))
            for arm in ("grpo", "cp_grpo")
            if runs.get(arm)
        },
        len(grpo) == len(cp) == planned_seeds,
    )


@dataclass(frozen=True)
class Endpoint:
    key: str
    name: str
    measure: str
    expected: int  # sign of grpo - cp_grpo the plan predicts
    per_run: Callable[[Run], float]


def endpoints(base: float) -> tuple[Endpoint, ...]:
    """The primary first, then S1-S4 (the family Holm adjusts)."""
    return (
        Endpoint("primary", "Length gap (primary)", "l- - l+ tokens, steps 21-end", +1, primary),
        Endpoint(
            "S1",
            "S1 sample efficiency",
            f"steps to train acc {base:.2f} + {S1_GAIN}",
            +1,
            lambda r: steps_to_gain(r, base),
        ),
        Endpoint("S2", "S2 late held-out accuracy", "greedy, 60/80/final", -1, late_accuracy),
        Endpoint("S3", "S3 entropy at shared nodes", "d7_entropy_shared, steps 10-40", -1, shared_entropy),
        Endpoint("S4", "S4 learning tax", "probe KL / max(gain, 0.05), last step", +1, learning_tax),
    )


@dataclass(frozen=True)
class Result:
    endpoint: Endpoint
    grpo: tuple[float, ...]
    cp: tuple[float, ...]
    comparison: Comparison  # grpo - cp_grpo
    paired: tuple[float, ...]  # per seed both arms have, grpo - cp_grpo
    holm_p: float  # secondaries only (NaN for the primary)

    @property
    def significant(self) -> bool:
        p = self.comparison.p_value if self.endpoint.key == "primary" else self.holm_p
        return math.isfinite(p) and p < ALPHA


def analyse(runs: dict[str, list[Run]], base: float) -> list[Result]:
    grpo, cp = runs.get("grpo", []), runs.get("cp_grpo", [])
    cp_by_seed = {r.seed: r for r in cp}
    raw = []
    for e in endpoints(base):
        a, b = tuple(e.per_run(r) for r in grpo), tuple(e.per_run(r) for r in cp)
        paired = tuple(e.per_run(r) - e.per_run(cp_by_seed[r.seed]) for r in grpo if r.seed in cp_by_seed)
        raw.append((e, a, b, compare(a, b), paired))
    adjusted = holm([c.p_value for _, _, _, c, _ in raw[1:]])
    return [
        Result(e, a, b, c, paired, math.nan if i == 0 else adjusted[i - 1])
        for i, (e, a, b, c, paired) in enumerate(raw)
    ]


def integrated_d2(run: Run) -> float:
    """grpo's dose: D2 summed over every training step."""
    return float(run.window("diag/d2_residual", 1, run.last_step).sum())


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Exact two-sided paired test of the mean of per-seed differences: the share of the 2^n sign patterns whose
    mean is at least as far from 0 as the observed one."""
    d = np.asarray([x for x in diffs if math.isfinite(x)], dtype=float)
    if d.size == 0:
        return math.nan
    observed = abs(d.mean())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
    return float((np.abs((signs * d).mean(1)) >= observed - 1e-12 * max(1.0, observed)).mean())


def exploratory(runs: dict[str, list[Run]], results: Sequence[Result]) -> list[str]:
    """The plan's exploratory measures, labelled so: no verdicts."""
    grpo, cp = runs.get("grpo", []), runs.get("cp_grpo", [])
    cp_by_seed = {r.seed: r for r in cp}
    paired = [r for r in grpo if r.seed in cp_by_seed]

    def last_eval(run: Run, key: str) -> float:
        return run.evals.get(run.last_step, {}).get(key, math.nan)

    per_arm = "; ".join(
        f"{arm}: fork entropy {summarize([_mean(r.window('diag/d7_entropy_fork', *S3_WINDOW)) for r in rs]).fmt()}"
        f", opening share at the last evaluation {summarize([last_eval(r, 'opening/top_share') for r in rs]).fmt()}"
        for arm, rs in (("grpo", grpo), ("cp_grpo", cp))
        if rs
    )
    lines = [
        f"**Exploratory** (no verdicts). The primary's paired sign-flip test: "
        f"p={_n(sign_flip_p(results[0].paired)) if len(results[0].paired) >= 2 else 'n/a'} "
        f"({len(results[0].paired)} paired seeds). {per_arm} (fork entropy: diag/d7_entropy_fork over steps 10-40).",
        "",
        "| seed | grpo's integrated D2 | "
        + " | ".join(f"{r.endpoint.key}: grpo - cp_grpo" for r in results)
        + " |",
        "|---|---|" + "---|" * len(results),
    ]
    for run in paired:
        other = cp_by_seed[run.seed]
        diffs = [r.endpoint.per_run(run) - r.endpoint.per_run(other) for r in results]
        lines.append(f"| {run.seed} | {_n(integrated_d2(run))} | " + " | ".join(map(_n, diffs)) + " |")
    return [*lines, ""]


def primary_reading(result: Result, cap: int) -> str:
    """The plan's four readings of the primary endpoint."""
    c = result.comparison
    if c.n_a < 2 or c.n_b < 2:
        return "not enough runs to test yet"
    low, high = c.ci()
    interest = EFFECT_OF_INTEREST * cap
    if result.significant:
        if c.diff > 0:
            reaches = "reaches" if low >= interest else "does not clearly reach"
            return (
                f"grpo > cp_grpo: the mechanism reaches behaviour; the CI {reaches} the effect of interest "
                f"(+{interest:.1f} tokens)"
            )
        return "grpo < cp_grpo: against both predictions (Dr. GRPO's and the paper's)"
    if high < interest:
        return (
            f"n.s., {direction(c.diff, +1)}; the CI's upper end is below the effect of interest "
            f"(+{interest:.1f} tokens): a difference that large is excluded at this scale, with the mechanism on"
        )
    return f"n.s., {direction(c.diff, +1)}; inconclusive: the CI includes the effect of interest (+{interest:.1f})"


def _seeds(rs: Sequence[Run]) -> str:
    return ", ".join(str(r.seed) for r in rs) or "none"


def _n(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else "n/a"


def section(runs_dir: Path, decisions_dir: Path = DATA) -> list[str]:
    """The section's markdown lines: "not yet run" until the first run's summary is committed."""
    head = ["## Testbed 5: grpo against cp_grpo with the length gap kept open (pre-registered)", ""]
    runs = load_runs(runs_dir)
    try:
        decisions: Decisions | None = load_decisions(decisions_dir)
    except NoPilotDecision:
        decisions = None
    if decisions is None:
        status = pilot_stop(decisions_dir) or (
            f"the pilot has not recorded its decisions (`results/testbed5/pilot_*.json`; `{PILOT_COMMAND}`)"
        )
        return [
            *head,
            f"**Not yet run**: {status}. Plan, gates, endpoints and analysis, fixed before any run: "
            "`experiments/testbed5_plan.md`.",
            "",
        ]
    design = decisions.design
    done = sum(len(v) for v in runs.values())
    setup = (
        f"SmolLM2-135M-Instruct on `a + b` (operands 0-{MAX_OPERAND}; a response is right when its last number "
        f"is the sum, as amended before the pilot's third step 1), {design.steps} steps of 8 prompts x 8 samples "
        f"at T = 0.7, response cap {decisions.cap} tokens (base accuracy {decisions.base_accuracy:.3f}), lr "
        f"{decisions.lr:g} (the pilot's choices, `results/testbed5/pilot_*.json`; the lr rule's second gate was "
        "amended after its runs, dated in the plan). Runs finished: "
        f"{done} of {2 * len(design.seeds)} (grpo seeds {_seeds(runs.get('grpo', []))}; cp_grpo seeds "
        f"{_seeds(runs.get('cp_grpo', []))})"
        + ("" if design == FULL else "; cut to 5 seeds x 80 steps by the pilot's budget rule")
        + "."
    )
    if not runs:
        return [
            *head,
            "**Not yet run**: no study run has finished yet (`python -m experiments testbed5 study --commit`). "
            "Plan, gates, endpoints and analysis, fixed before any run and amended only by dated entries: "
            "`experiments/testbed5_plan.md`.",
            "",
            setup,
            "",
        ]
    check = manipulation_check(runs, len(design.seeds))
    results = analyse(runs, decisions.base_accuracy)
    lines = [
        *head,
        setup,
        "",
        "**Manipulation check** (read first): "
        f"grpo's mean D2 over steps 1-50 >= {MANIP_D2} in {check.grpo_passing} of {len(check.grpo_d2)} seeds "
        f"(needed: {check.grpo_needed} of {len(design.seeds)}; per seed {', '.join(map(_n, check.grpo_d2))}); "
        f"cp_grpo's largest D2 {_n(check.cp_max_d2)} (needed <= {RESIDUAL_TOLERANCE:g} on every step); "
        "length gap / mean length over steps 1-50: "
        + ", ".join(f"{arm} {_n(v)}" for arm, v in check.gap_share.items())
        + f" (needed >= {GAP_SHARE_MIN} in both arms). "
        + (
            "It holds: the endpoints below test the mechanism switched on."
            if check.holds
            else ("It does not hold" if check.complete else "Not all runs are in, so it cannot hold yet")
            + ": the study is uninformative (never 'no effect'); the endpoints below are descriptive."
        ),
        "",
        "| Endpoint | Measure | grpo | cp_grpo | grpo - cp_grpo | Holm p | per-seed grpo - cp_grpo | Reading |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.comparison
        # a permutation test of one run against one gives p = 1 whatever the runs say: no p until two a side
        testable = c.n_a >= 2 and c.n_b >= 2
        if r.endpoint.key == "primary":
            reading = primary_reading(r, decisions.cap)
        elif not testable:
            reading = "not enough runs to test yet"
        else:
            way = direction(c.diff, r.endpoint.expected)
            reading = (("passes, " if r.significant else "n.s., ") + way) if c.diff != 0 else way
        holm_p = _n(r.holm_p) if r.endpoint.key != "primary" and testable else "-"
        lines.append(
            f"| {r.endpoint.name} | {r.endpoint.measure} | {summarize(r.grpo).fmt()} | {summarize(r.cp).fmt()} | "
            f"{c.fmt_effect()} | {holm_p} | "
            f"{', '.join(map(_n, r.paired)) or '-'} | {reading} |"
        )
    lines += [
        "",
        "The primary is tested alone at 0.05 (exact two-sided permutation test of the difference of means; 95% CI "
        "Welch's t); S1-S4 are Holm-adjusted over the four. A secondary that passes while the primary does not is "
        "not the mechanism's effect.",
        "",
        *exploratory(runs, results),
    ]
    return lines
