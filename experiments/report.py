"""REPORT.md from the results files: claim by claim, what reproduced, what did not, effect sizes.

Every verdict is computed from the data by an explicit rule printed next to it (a difference of means
with its 95% CI and an exact permutation p-value, Holm-adjusted over the testbed's family of tests, or a
threshold derived in docs/objectives.md#the-tabular-toy), so a rerun with different numbers rewrites the
verdicts instead of contradicting them. Claims that follow from the loss algebra are reported apart from the
empirical ones: a run confirms the code there, not a hypothesis.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import ibpo_report, plots, testbed4_report, testbed5_report
from experiments.diag import EXACT
from experiments.stats import (
    Comparison,
    Summary,
    compare,
    detectable_difference,
    direction,
    holm,
    pooled_sd,
    summarize,
)
from experiments.testbed4_report import verdict as class_verdict

ALPHA = 0.05
TESTBEDS = {
    "tabular": "Testbed 1 (tabular toy)",
    "tinylm": "Testbed 2 (tiny LM)",
    "trainer": "Testbed 3 (real trainer)",
}


# -- reading results ------------------------------------------------------------------------------------
class View:
    """Lookup of per-seed final values by (group, objective, setting label)."""

    def __init__(self, results: dict[str, Any]):
        self.results = results
        self.testbed = results["testbed"]
        # What the claim checks asked for, (objective or None, group, label or None): lets the report say
        # which runs a finding rests on and which of the conditions it needs have not run yet.
        self.requests: list[tuple[str | None, str, str | None]] = []
        self.class_cache: list[ClassRow] | None = None  # `class_rows`: its permutation tests run once

    def cond(self, objective: str, group: str = "main", label: str | None = None) -> dict[str, Any] | None:
        self.requests.append((objective, group, label))
        for c in self.results["conditions"]:
            if c["objective"] == objective and c["group"] == group and (label is None or c["label"] == label):
                return c
        return None

    def values(self, objective: str, key: str, group: str = "main", label: str | None = None) -> list[float]:
        c = self.cond(objective, group, label)
        if c is None:
            return []
        return [v for v in c["final"].get(key, []) if v is not None and math.isfinite(v)]

    def summary(self, objective: str, key: str, group: str = "main", label: str | None = None) -> Summary:
        return summarize(self.values(objective, key, group, label))

    def objectives(self, group: str = "main") -> list[str]:
        self.requests.append((None, group, None))
        return list(dict.fromkeys(c["objective"] for c in self.results["conditions"] if c["group"] == group))

    def labels(self, group: str) -> list[str]:
        self.requests.append((None, group, None))
        out: list[str] = []
        for c in self.results["conditions"]:
            if c["group"] == group and c["label"] not in out:
                out.append(c["label"])
        return out

    def n_seeds(self) -> int:
        return len(self.results.get("seeds", []))

    def planned(self) -> list[dict[str, Any]]:
        """The study's conditions as planned (results files from before "planned" existed: those that ran)."""
        return self.results.get("planned") or self.results["conditions"]

    def missing_runs(self) -> int:
        """Planned (condition, seed) runs that are not in the results."""
        done = sum(len(c["seeds"]) for c in self.results["conditions"])
        return len(self.planned()) * self.n_seeds() - done

    def provenance(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(conditions that ran, planned conditions that have not) among those requested since the last call."""

        def asked(c: dict[str, Any]) -> bool:
            return any(
                c["group"] == g and o in (None, c["objective"]) and lab in (None, c["label"])
                for o, g, lab in self.requests
            )

        ran = [c for c in self.results["conditions"] if asked(c)]
        keys = {c["key"] for c in ran}
        missing = [c for c in self.planned() if asked(c) and c["key"] not in keys]
        self.requests = []
        return ran, missing


def load_results(results_dir: Path) -> dict[str, dict[str, Any]]:
    """testbed -> results, from `<dir>/*.json` (the full study wins over a CI-sized one)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("testbed") not in TESTBEDS or not data.get("conditions"):
            continue
        prev = found.get(data["testbed"])
        if prev is None or (prev.get("size") != "full" and data.get("size") == "full"):
            found[data["testbed"]] = data
    return found


# -- verdicts -------------------------------------------------------------------------------------------
@dataclass
class Finding:
    testbed: str
    verdict: (
        str  # "reproduced" | "opposite" | "n.s., ..." | "not reproduced" | "partly" | "not measured" | ...
    )
    text: str  # one or two sentences with the numbers
    table: list[list[str]] | None = None
    data: str = ""  # part-run studies only: the runs the finding rests on, what has not run yet
    note: str = ""  # part-run studies only: the summary table's " (N runs, partial)"
    test: Comparison | None = None  # the grpo - cp_grpo test the verdict reads (oriented: > 0 as predicted)


@dataclass
class Claim:
    ident: str
    title: str
    source: str  # where the claim comes from
    rule: str  # how the verdict is decided
    check: Callable[[View], Finding | None]
    # True: the claim follows from the loss algebra (docs/objectives.md), so a run checks the implementation,
    # not a hypothesis about training; such claims stay out of the multiplicity families
    by_construction: bool = False


def _fmt(s: Summary, digits: int = 3) -> str:
    return s.fmt(digits)


def _drift(values: list[float], centre: float = 0.5) -> list[float]:
    return [abs(v - centre) for v in values]


def reading(diff: float, p: float) -> str:
    """Verdict for a claim that predicts diff > 0, read at ALPHA from `p` (Holm-adjusted where the claim is
    one of a family): reproduced, opposite (significant the other way), or "n.s." with the direction the
    difference points (a non-significant difference is no evidence of absence, and its sign is data)."""
    if not math.isfinite(p):
        return "not measured"
    if p < ALPHA:
        return "reproduced" if diff > 0 else "opposite"
    return f"n.s., {direction(diff, +1)}"


def _direction(a: list[float], b: list[float]) -> tuple[str, str, Comparison | None]:
    """Verdict for the claim mean(a) > mean(b) at the raw p (render adjusts it over the testbed's family), the
    formatted difference (95% CI, raw p) and the comparison."""
    c = compare(a, b)
    if c.n_a < 2 or c.n_b < 2:
        return "not measured", c.fmt(), None
    return reading(c.diff, c.p_value), c.fmt_effect(), c


# The claims whose verdict is a permutation test of one objective against another (grpo - cp_grpo; C4: the
# PPO clip against its sign-independent twin): one family per testbed, Holm-adjusted, as testbed 4's pair
# (the class comparison of every outcome is the other family, `class_rows`).
PAIR_FAMILY = ("C2", "C4", "C5", "C6", "C7", "C11")


def adjust_family(found: list[Finding]) -> None:
    """Holm-adjust the tests of one testbed's family in place: each verdict is re-read at its adjusted p and
    the text says so. Findings without a test (not measured, not testable) are not counted."""
    tested = [(f, f.test) for f in found if f.test is not None]
    for (f, test), adjusted in zip(tested, holm([t.p_value for _, t in tested]), strict=True):
        f.verdict = reading(test.diff, adjusted)
        f.text += f" Holm-adjusted over this testbed's {len(tested)} two-objective tests: p={adjusted:.2g}."


def _keys(view: View) -> dict[str, str]:
    """Metric names per testbed for the quantities the claims talk about."""
    if view.testbed == "tabular":
        return {
            "d1": "cancel_resid",
            "verbose": "p_verbose",
            "acc": "success",
            "t": "t75",
            "equiv": "solution_logodds",
            "tmpl": "template_drift",
            "ent_common": "diag/d7_entropy_common",
            "ent": "filler_entropy",
            "clip_pos": "diag/d10_clipfrac_common_pos",
            "clip_neg": "diag/d10_clipfrac_common_neg",
        }
    if view.testbed == "tinylm":
        return {
            "d1": "diag/d1_gcpr",
            "verbose": "eval/p_verbose",
            "acc": "eval/accuracy",
            "t": "eval/steps_to_threshold",
            "equiv": "eval/equiv_drift",
            "tmpl": "eval/template_drift",
            "ent_common": "diag/d7_entropy_common",
            "ent": "diag/d7_entropy_mean",
            "probe": "probe/kl",
            "len_ok": "rollout/length_correct",
            "len_bad": "rollout/length_wrong",
            "clip_pos": "diag/d10_clipfrac_common_pos",
            "clip_neg": "diag/d10_clipfrac_common_neg",
        }
    return {
        "d1": "diag/d1_gcpr",
        "d2": "diag/d2_residual",
        "acc": "reward/accuracy",
        "ent": "diag/d7_entropy_mean",
        "ent_common": "diag/d7_entropy_common",
        "len": "response/length_mean",
        "t": "steps_to_threshold",
    }


def coefficient_class(preset: str, overrides: dict[str, Any]) -> str:
    """exact: cancels for any ratio; gate: breaks only through a sign-dependent gate (so only off-policy,
    where the gate bites); coupled: a response-coupled coefficient or a mean-shifted advantage."""
    import rlcore

    preserves, reasons = rlcore.cancellation_verdict(rlcore.resolve(preset, overrides))
    if preserves:
        return "exact"
    return "gate" if all(r.startswith("gate=") for r in reasons) else "coupled"


def check_residual(view: View) -> Finding | None:
    k = _keys(view)["d1"]
    rows, bad = [], []
    for o in view.objectives("main"):
        c = view.cond(o)
        cls = coefficient_class(c["preset"], c.get("overrides") or {})
        s = summarize([v for v in c["final"].get(k, []) if v is not None])
        if s.n == 0:
            continue
        rows.append([c["objective"], cls, _fmt(s)])
        if (cls == "exact" and s.mean > 1e-4) or (cls == "coupled" and s.mean < 0.05):
            bad.append(f"{c['objective']} ({cls}, D1 {_fmt(s)})")
    if not rows:
        return None
    text = (
        "Every exchangeable objective has D1 <= 1e-4 and every response-coupled one has D1 >= 0.05; "
        "gate-only breakers sit in between, depending on how often their gate bites."
        if not bad
        else "Exceptions to the rule: " + ", ".join(bad) + "."
    )
    return Finding(
        view.testbed,
        "reproduced" if not bad else "partly",
        text,
        [["objective", "coefficient class", "D1 residual (mean over optimizer steps)"], *rows],
    )


def check_drift(view: View) -> Finding | None:
    k = _keys(view).get("verbose")
    if k is None:
        return None
    g, cp = view.values("grpo", k), view.values("cp_grpo", k)
    if not g or not cp:
        return None
    verdict, diff, test = _direction(_drift(g), _drift(cp))
    text = (
        f"P(verbose) (init 0.5) ends at {_fmt(summarize(g))} under grpo and {_fmt(summarize(cp))} under "
        f"cp_grpo; drift |p-0.5| grpo - cp_grpo = {diff}. The verbose style only adds tokens, so this is "
        "the length bias Dr. GRPO described for GRPO's 1/|o_i| (the shorter of two equally rewarded "
        "choices gains), seen here on a reward-irrelevant choice."
    )
    lengths = view.testbed == "tinylm"  # the tiny LM also chooses its length freely (reward-irrelevant)
    rows = [
        ["objective", "P(verbose) final", "abs(P(verbose)-0.5)"]
        + (["length of correct responses", "length of wrong responses"] if lengths else [])
    ]
    for o in view.objectives():
        vals = view.values(o, k)
        rows.append(
            [o, _fmt(summarize(vals)), _fmt(summarize(_drift(vals)))]
            + (
                [
                    _fmt(view.summary(o, "rollout/length_correct")),
                    _fmt(view.summary(o, "rollout/length_wrong")),
                ]
                if lengths
                else []
            )
        )
    start = [
        (view.cond(o) or {}).get("curves", {}).get(f"rollout/length_{w}", {}).get("mean", [None])[0]
        for o in ("grpo", "cp_grpo")
        for w in ("correct", "wrong")
    ]
    if lengths and None not in start:
        text += (
            f" Response lengths are reward-irrelevant too; over the first evaluation interval they are "
            f"{start[0]:.1f} (correct) / {start[1]:.1f} (wrong) tokens under grpo and {start[2]:.1f} / "
            f"{start[3]:.1f} under cp_grpo."
        )
    return Finding(view.testbed, verdict, text, rows, test=test)


COUPLED = ("grpo", "gspo", "dfpo_orth", "grpo_ar", "grpo_lopti")  # response-coupled coefficients: break (U)
CONSTANT = ("dr_grpo", "dapo", "cispo", "cp_grpo", "dfpo_min")  # step-constant coefficients


@dataclass(frozen=True)
class Outcome:
    """One measure of testbeds 1-2 compared by coefficient class: `value` gives its per-run values of an
    objective's main-setting condition; `expected`: +1 the prediction is coupled higher, -1 lower."""

    name: str
    value: Callable[[View, str], list[float]]
    expected: int
    predicted_by: str = "the paper"


def _final(key: str, transform: Callable[[float], float] = lambda v: v) -> Callable[[View, str], list[float]]:
    return lambda view, o: [transform(v) for v in view.values(o, key)]


def _length_gap(view: View, o: str) -> list[float]:
    """Wrong minus right response length per run (both logged: seed by seed, not mean against mean)."""
    final = (view.cond(o) or {}).get("final", {})
    pairs = zip(final.get("rollout/length_wrong", []), final.get("rollout/length_correct", []), strict=False)
    return [w - c for w, c in pairs if w is not None and c is not None and math.isfinite(w - c)]


def outcomes(view: View) -> list[Outcome]:
    """Every outcome testbed 1 or 2 measured, with the direction its prediction gives."""
    k = _keys(view)
    if "verbose" not in k:
        return []
    out = [
        Outcome(
            "reward-irrelevant drift |P(verbose) - 0.5|", _final(k["verbose"], lambda v: abs(v - 0.5)), +1
        ),
        Outcome("template drift |log-odds change| (group-common token)", _final(k["tmpl"]), +1),
        Outcome("equivalent-solution log-odds drift", _final(k["equiv"]), +1),
        Outcome("entropy on group-common prefixes (D7)", _final(k["ent_common"]), -1),
        Outcome(
            "filler entropy" if view.testbed == "tabular" else "mean token entropy (D7)", _final(k["ent"]), -1
        ),
        Outcome("steps to the accuracy threshold", _final(k["t"]), +1),
        Outcome("final accuracy", _final(k["acc"]), -1),
    ]
    if "probe" in k:
        out += [
            Outcome("probe KL on unrelated contexts (D5)", _final(k["probe"]), +1),
            Outcome("learning tax (probe KL / accuracy gain)", _final("probe/learning_tax"), +1),
            Outcome("length bias: wrong minus right response length", _length_gap, +1, "Dr. GRPO"),
        ]
    return out


@dataclass(frozen=True)
class ClassRow:
    outcome: Outcome
    comparison: Comparison  # coupled minus constant, runs pooled
    holm_p: float
    detectable: float
    verdict: str


def class_rows(view: View) -> list[ClassRow]:
    """Every outcome of a testbed, response-coupled against step-constant objectives (main setting, runs
    pooled), Holm-adjusted over the outcomes: the same standard as testbed 4's table."""
    if view.class_cache is not None:
        return view.class_cache
    found = []
    for outcome in outcomes(view):
        a = [v for o in COUPLED for v in outcome.value(view, o)]
        b = [v for o in CONSTANT for v in outcome.value(view, o)]
        if len(a) > 1 and len(b) > 1:
            found.append((outcome, a, b, compare(a, b)))
    rows = []
    for (outcome, a, b, c), adjusted in zip(found, holm([f[3].p_value for f in found]), strict=True):
        detectable = detectable_difference(pooled_sd([a, b]), len(a), len(b), ALPHA / len(found))
        said = class_verdict(
            c.diff, adjusted, outcome.expected, c.n_a, c.n_b, len(found), by=outcome.predicted_by
        )
        rows.append(ClassRow(outcome, c, adjusted, detectable, said))
    view.class_cache = rows
    return rows


def class_word(said: str) -> str:
    """A class-table verdict in the claim vocabulary (reproduced / opposite / n.s., direction)."""
    if said.startswith("as "):
        return "reproduced"
    return "opposite" if said.startswith("opposite") else said


def check_family_drift(view: View) -> Finding | None:
    """(U): response-coupled coefficients drift, constant ones do not (docs/objectives.md#shared-nodes-and-cancellation):
    the drift row of the class comparison, so its verdict carries that table's Holm adjustment."""
    rows = class_rows(view)
    if not rows or not rows[0].outcome.name.startswith("reward-irrelevant drift"):
        return None
    row = rows[0]
    k = _keys(view)["verbose"]
    coupled = [o for o in COUPLED if view.values(o, k)]
    constant = [o for o in CONSTANT if view.values(o, k)]
    text = (
        f"Pooled over seeds, |P(verbose)-0.5| is {_fmt(summarize([v for o in coupled for v in _drift(view.values(o, k))]))} "
        f"for response-coupled coefficients ({', '.join(coupled)}) and "
        f"{_fmt(summarize([v for o in constant for v in _drift(view.values(o, k))]))} for step-constant ones "
        f"({', '.join(constant)}); difference {row.comparison.fmt_effect()}, Holm-adjusted over the "
        f"{len(rows)} outcomes of the class comparison: p={row.holm_p:.2g}."
    )
    return Finding(view.testbed, class_word(row.verdict), text)


def class_section(views: dict[str, View]) -> list[str]:
    """Markdown: the class comparison of every outcome, per testbed that has one."""
    out: list[str] = []
    for t, view in views.items():
        rows = class_rows(view)
        if not rows:
            continue
        if not out:
            out = [
                "## Every outcome by coefficient class (testbeds 1-2)",
                "",
                f"Response-coupled ({', '.join(COUPLED)}) minus step-constant ({', '.join(CONSTANT)}) "
                "objectives, main setting, runs pooled over objectives and seeds; 95% CI (Welch's t), raw "
                f"permutation p, Holm-adjusted over the testbed's outcomes (the verdict reads it at {ALPHA}); "
                "*detectable*: the difference found with 80% power at the strictest Holm level, from the spread "
                "within each class (arms pooled, t quantiles). Predicted directions are the paper's, Dr. GRPO's "
                "for the length bias. This is the same standard as testbed 4's table; C2b is its first row.",
                "",
            ]
        against = [r.outcome.name for r in rows if "against" in r.verdict or r.verdict.startswith("opposite")]
        out += [
            f"**{TESTBEDS[t]}.**"
            + (f" Against the prediction (significant or not): {'; '.join(against)}." if against else ""),
            "",
            _table(
                [
                    [
                        "outcome",
                        "coupled",
                        "constant",
                        "coupled - constant",
                        "Holm p",
                        "detectable",
                        "verdict",
                    ],
                    *(
                        [
                            r.outcome.name,
                            _fmt(_class_side(view, r.outcome, COUPLED)),
                            _fmt(_class_side(view, r.outcome, CONSTANT)),
                            r.comparison.fmt_effect(),
                            f"{r.holm_p:.2g}",
                            f"{r.detectable:.2g}",
                            r.verdict,
                        ]
                        for r in rows
                    ),
                ]
            ),
            "",
        ]
    return out


def _class_side(view: View, outcome: Outcome, objectives: tuple[str, ...]) -> Summary:
    return summarize([v for o in objectives for v in outcome.value(view, o)])


def check_dfpo(view: View) -> Finding | None:
    k = _keys(view)
    if view.testbed == "trainer" or not view.values("dfpo_min", k["verbose"]):
        return None
    parts, ok = [], []
    for o in ("dfpo_min", "dfpo_orth", "dfpo_min_seqlen"):
        d1, pv = view.summary(o, k["d1"]), view.summary(o, k["verbose"])
        if pv.n:
            parts.append(f"{o}: D1 {_fmt(d1)}, P(verbose) {_fmt(pv)}")
    pv_min, pv_orth = view.summary("dfpo_min", k["verbose"]), view.summary("dfpo_orth", k["verbose"])
    d1_min = view.summary("dfpo_min", k["d1"])
    ok.append(d1_min.mean <= 1e-4 and abs(pv_min.mean - 0.5) < 0.25)
    if pv_orth.n:
        ok.append(abs(pv_orth.mean - 0.5) >= 0.25)  # expected: Orth fixes D1 but not (U)
    seqlen = view.summary("dfpo_min_seqlen", k["verbose"])
    if seqlen.n:
        ok.append(seqlen.mean > 0.9 or seqlen.mean < 0.1)  # expected: over-correction
    verdict = "reproduced" if all(ok) else ("partly" if any(ok) else "not reproduced")
    return Finding(view.testbed, verdict, "; ".join(parts) + ".")


def check_clip(view: View) -> Finding | None:
    k = _keys(view)
    labels = view.labels("gate") or [None]
    group = "gate" if view.labels("gate") else "main"
    findings = []
    for label in labels:
        dr, sym = (
            view.values("dr_grpo", k["d1"], group, label),
            view.values("dr_grpo_symgate", k["d1"], group, label),
        )
        ref_name = "dr_grpo_symgate" if sym else "cp_grpo"
        ref = sym or view.values("cp_grpo", k["d1"], group, label)
        if not dr or not ref:
            continue
        verdict, diff, test = _direction(dr, ref)
        bite = view.summary("dr_grpo", k["clip_pos"], group, label).mean if "clip_pos" in k else float("nan")
        bite_neg = (
            view.summary("dr_grpo", k["clip_neg"], group, label).mean if "clip_neg" in k else float("nan")
        )
        if max(bite, bite_neg) == 0:
            # The claim is conditional on the clip biting: where it never did, the data say nothing either way.
            verdict, test = "not testable (the clip never bit)", None
        elif max(summarize(dr).mean, summarize(ref).mean) <= EXACT:
            # Both cancel to rounding (C1's threshold): a "difference" there is float noise, not a residual.
            verdict, diff, test = (
                "not reproduced",
                f"{diff}, both at numerical zero (<= {EXACT:g}: rounding, no residual)",
                None,
            )
        where = f"the '{label}' setting" if label else "the main setting"
        text = (
            f"In {where}, dr_grpo (sign-dependent PPO clip, constant normaliser) has D1 {_fmt(summarize(dr))}; "
            f"{ref_name} (sign-independent gate) {_fmt(summarize(ref))}; difference {diff}."
        )
        if "clip_pos" in k:
            text += f" The gate removed {bite:.2g} (A>0) and {bite_neg:.2g} (A<0) of dr_grpo's common-prefix tokens."
        findings.append((max(bite, bite_neg) if bite == bite else 0.0, verdict, text, test))
    if not findings:
        return None
    # The verdict comes from the setting where the gate bit most on shared tokens (the claim is conditional on it).
    findings.sort(key=lambda f: f[0], reverse=True)
    rows = [["setting", "objective", "D1", "P(verbose)", "success / accuracy"]]
    for label in labels:
        for o in view.objectives(group):
            if view.cond(o, group, label) is None:
                continue
            rows.append(
                [
                    label or "main",
                    o,
                    _fmt(view.summary(o, k["d1"], group, label)),
                    _fmt(view.summary(o, k.get("verbose", ""), group, label)),
                    _fmt(view.summary(o, k["acc"], group, label)),
                ]
            )
    return Finding(view.testbed, findings[0][1], " ".join(f[2] for f in findings), rows, test=findings[0][3])


def _pair(view: View, key_name: str, what: str, higher_is_worse: bool = True) -> Finding | None:
    k = _keys(view).get(key_name)
    if k is None:
        return None
    g, cp = view.values("grpo", k), view.values("cp_grpo", k)
    if not g or not cp:
        return None
    verdict, diff, test = _direction(g, cp) if higher_is_worse else _direction(cp, g)
    sign = "grpo - cp_grpo" if higher_is_worse else "cp_grpo - grpo"
    text = f"{what}: grpo {_fmt(summarize(g))}, cp_grpo {_fmt(summarize(cp))} ({sign} = {diff})."
    return Finding(view.testbed, verdict, text, test=test)


def check_spillover(view: View) -> Finding | None:
    if view.testbed != "tinylm":
        return None
    f = _pair(view, "probe", "Probe KL(pi || pi_0) on unrelated contexts (D5)")
    if f is None:
        return None
    rows = [["objective", "probe KL", "probe KL at template", "learning tax (KL / acc gain)"]]
    for o in view.objectives():
        rows.append(
            [
                o,
                _fmt(view.summary(o, "probe/kl")),
                _fmt(view.summary(o, "probe/kl_template")),
                _fmt(view.summary(o, "probe/learning_tax")),
            ]
        )
    f.table = rows
    return f


def check_entropy(view: View) -> Finding | None:
    f = _pair(
        view,
        "ent_common",
        "Entropy on group-common-prefix positions (D7, lower = more collapsed)",
        higher_is_worse=False,
    )
    k = _keys(view)
    if f is not None and not view.values("grpo", k["d1"]) and not view.values("cp_grpo", k["d1"]):
        # D1 undefined in every run: no group ever shared a prefix, and D7's common-prefix entropy reads 0 by
        # the diagnostics' convention for an undefined statistic, which is no evidence either way.
        f = Finding(
            view.testbed,
            "not measured",
            "No group of responses shared a common prefix in any step (D1 "
            "undefined in every run), so there were no common-prefix positions whose entropy could "
            "collapse; D7's common-prefix entropy reads 0 by convention.",
        )
    return f


def check_equiv(view: View) -> Finding | None:
    return _pair(view, "equiv", "Equivalent-solution log-odds drift |log p(a)/p(b)|")


def check_efficiency(view: View) -> Finding | None:
    k = _keys(view)
    t = k.get("t")
    g = view.summary("grpo", t) if t else Summary(float("nan"), float("nan"), 0)
    if g.n == 0:
        return None
    fixes = [o for o in ("cp_grpo", "dfpo_min") if view.summary(o, t).n]
    if not fixes:
        return None  # nothing to compare grpo with
    rows = [["objective", "steps to threshold", "ratio to grpo", f"final {k['acc']}"]]
    slow = []
    for o in view.objectives():
        s = view.summary(o, t)
        if s.n == 0:
            continue
        ratio = s.mean / g.mean if g.mean else float("nan")
        rows.append([o, _fmt(s), f"{ratio:.2f}", _fmt(view.summary(o, k["acc"]))])
        if o in ("cp_grpo", "dfpo_min") and ratio > 1.1:
            slow.append(o)
    gs, dm = view.summary("gspo", t), view.summary("dfpo_min", t)
    extra = f" dfpo_min / gspo = {dm.mean / gs.mean:.2f} (paper: 0.91)." if gs.n and dm.n and gs.mean else ""
    text = (
        f"The cancellation-preserving fixes ({', '.join(fixes)}) reach the threshold within 10% of grpo's steps "
        "or faster."
        if not slow
        else f"Slower than grpo by more than 10%: {', '.join(slow)}."
    ) + extra
    diffs = [f"{o} - grpo {compare(view.values(o, t), view.values('grpo', t)).fmt_effect()}" for o in fixes]
    text += f" Steps: {'; '.join(diffs)} (a descriptive rule: the ratio is not a test)."
    return Finding(view.testbed, "reproduced" if not slow else "not reproduced", text, rows)


def check_group_size(view: View) -> Finding | None:
    k = _keys(view)
    labels = view.labels("group_size")
    if not labels:
        return None
    base_g = view.results["base"]["group_size"]
    rows = [
        ["G", "grpo D1", "grpo abs(P(verbose)-0.5)", "cp_grpo abs(P(verbose)-0.5)", "gap (grpo - cp_grpo)"]
    ]
    gaps = []
    for lab in sorted([*labels, f"G={base_g}"], key=lambda s: int(s.split("=")[1])):
        group = "main" if lab == f"G={base_g}" else "group_size"
        label = None if group == "main" else lab
        g = _drift(view.values("grpo", k["verbose"], group, label))
        cp = _drift(view.values("cp_grpo", k["verbose"], group, label))
        d1 = view.summary("grpo", k["d1"], group, label)
        c = compare(g, cp)
        gaps.append(c.diff)
        rows.append([lab.split("=")[1], _fmt(d1), _fmt(summarize(g)), _fmt(summarize(cp)), c.fmt()])
    grows = all(b >= a - 1e-9 for a, b in zip(gaps, gaps[1:], strict=False)) and gaps[-1] > gaps[0]
    text = (
        "The grpo-vs-cp_grpo drift gap grows monotonically with G."
        if grows
        else "The grpo-vs-cp_grpo drift gap does not grow monotonically with G."
    )
    return Finding(view.testbed, "reproduced" if grows else "not reproduced", text, rows)


def check_split(view: View) -> Finding | None:
    k = _keys(view)
    labels = view.labels("split")
    if len(labels) < 2:
        return None
    whole, split = labels[0], labels[1]
    rows = [
        [
            "objective",
            f"D1 ({whole})",
            f"D1 ({split})",
            f"abs(P(verbose)-0.5) ({whole})",
            f"abs(P(verbose)-0.5) ({split})",
        ]
    ]
    cp_whole = view.values("cp_grpo", k["d1"], "split", whole)
    cp_split = view.values("cp_grpo", k["d1"], "split", split)
    for o in view.objectives("split"):
        if o in [r[0] for r in rows]:
            continue
        rows.append(
            [
                o,
                _fmt(view.summary(o, k["d1"], "split", whole)),
                _fmt(view.summary(o, k["d1"], "split", split)),
                _fmt(summarize(_drift(view.values(o, k["verbose"], "split", whole)))),
                _fmt(summarize(_drift(view.values(o, k["verbose"], "split", split)))),
            ]
        )
    if not cp_whole or not cp_split:
        return Finding(view.testbed, "not measured", "cp_grpo was not part of the split ablation.", rows)
    held = max(cp_whole) <= EXACT and min(cp_split) >= 0.05
    text = (
        f"Splitting each group over two optimizer steps raises cp_grpo's per-step D1 from "
        f"{_fmt(summarize(cp_whole))} to {_fmt(summarize(cp_split))} (difference "
        f"{compare(cp_split, cp_whole).fmt_effect()})."
    )
    return Finding(view.testbed, "reproduced" if held else "not reproduced", text, rows)


def check_epochs(view: View) -> Finding | None:
    k = _keys(view)
    if "1 epoch" not in view.labels("epochs"):
        return None
    g, cp = (
        _drift(view.values("grpo", k["verbose"], "epochs", "1 epoch")),
        _drift(view.values("cp_grpo", k["verbose"], "epochs", "1 epoch")),
    )
    if not g or not cp:
        return None
    verdict, diff, test = _direction(g, cp)
    rows = [
        [
            "objective",
            "D1 (1 epoch)",
            f"D1 ({view.results['base']['epochs']} epochs)",
            "P(verbose) (1 epoch)",
            f"P(verbose) ({view.results['base']['epochs']} epochs)",
        ]
    ]
    for o in view.objectives("epochs"):
        rows.append(
            [
                o,
                _fmt(view.summary(o, k["d1"], "epochs", "1 epoch")),
                _fmt(view.summary(o, k["d1"])),
                _fmt(view.summary(o, k["verbose"], "epochs", "1 epoch")),
                _fmt(view.summary(o, k["verbose"])),
            ]
        )
    text = (
        f"With one update per rollout (on-policy, no gate can bite), the drift gap |P(verbose)-0.5| "
        f"grpo - cp_grpo is {diff}."
    )
    return Finding(view.testbed, verdict, text, rows, test=test)


def trainer_tasks(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(condition group, task name) of testbed 3's tasks in plan order: "main" is the arithmetic task."""
    groups = dict.fromkeys(c["group"] for c in (results.get("planned") or results["conditions"]))
    return [(g, "arithmetic" if g == "main" else g.removeprefix("task:")) for g in groups]


def check_trainer(view: View) -> Finding | None:
    """C12 on D2 (every node shared by >= 2 responses of a group), which real rollouts have even when no
    token is common to a whole group; D1 (group-common nodes only) where D2 was not recorded. One table
    row per task and objective; the verdict needs every task where grpo and cp_grpo both ran to agree."""
    if view.testbed != "trainer":
        return None
    rows = [
        [
            "task",
            "objective",
            "seeds",
            "D1 residual",
            "D2 residual",
            "D2 credit",
            "D2 nodes/step",
            "D3 kappa CV",
            "final accuracy",
            "entropy",
            "common-prefix entropy",
            "length",
        ]
    ]
    k = _keys(view)
    texts, oks = [], []
    for group, task in trainer_tasks(view.results):
        for o in view.objectives(group):

            def cell(key: str, o: str = o, group: str = group) -> str:
                return _fmt(view.summary(o, key, group))

            rows.append(
                [
                    task,
                    o,
                    str(len((view.cond(o, group) or {}).get("seeds", []))),
                    cell(k["d1"]),
                    cell(k["d2"]),
                    cell("diag/d2_credit_frac"),
                    cell("diag/d2_nodes"),
                    cell("diag/d3_kappa_cv"),
                    cell(k["acc"]),
                    cell(k["ent"]),
                    # D7 reports 0 where no group had a common prefix; D1 is absent then
                    cell(k["ent_common"]) if view.values(o, k["d1"], group) else "n/a",
                    cell(k["len"]),
                ]
            )
        for name, key in (("D2", k["d2"]), ("D1", k["d1"])):
            g, cp = view.values("grpo", key, group), view.values("cp_grpo", key, group)
            if not (g and cp):
                continue
            oks.append(summarize(cp).mean <= EXACT < summarize(g).mean)
            text = (
                f"On {task}, {name} is {_fmt(summarize(g))} under grpo and {_fmt(summarize(cp))} under "
                f"cp_grpo (mean over each run's steps; seeds as in the table)."
            )
            orth = view.values("dfpo_orth", key, group)
            if (
                name == "D2" and orth
            ):  # its reweighting cancels on group-common nodes only (docs/objectives.md#dfpo-transforms)
                text += (
                    f" dfpo_orth, which cancels on tokens common to the whole group by construction, leaves "
                    f"{_fmt(summarize(orth))} on tokens that only some responses share."
                )
            texts.append(text)
            break
    if not oks:
        return Finding(
            view.testbed,
            "not measured",
            "grpo and cp_grpo were not both run on a task, or no step had a node shared by two responses.",
            rows,
        )
    verdict = "reproduced" if all(oks) else "not reproduced"
    return Finding(view.testbed, verdict, "Through the real trainer: " + " ".join(texts), rows)


_HOLM = " Holm-adjusted over the testbed's two-objective tests (" + ", ".join(PAIR_FAMILY) + ")"

CLAIMS = [
    Claim(
        "C1",
        "Response-coupled coefficients and sign-dependent gates leave a residual on group-common tokens; "
        "exchangeable objectives cancel exactly",
        "arXiv 2604.13088 v1 Cor. 3.3; docs/objectives.md#shared-nodes-and-cancellation, #knobs-and-the-cancellation-verdict",
        "D1 <= 1e-4 for every objective rlcore marks cancellation-preserving and >= 0.05 for the others.",
        check_residual,
        by_construction=True,
    ),
    Claim(
        "C2",
        "Non-cancellation causes systematic reward-irrelevant drift: grpo drifts, cp_grpo does not",
        "paper abstract ('solution probability drift'); docs/objectives.md#length-normalisation",
        f"|P(verbose) - 0.5| larger under grpo than under cp_grpo, permutation p < {ALPHA}{_HOLM}.",
        check_drift,
    ),
    Claim(
        "C2b",
        "The drift follows the coefficient class (U), not the name of the method",
        "docs/objectives.md#shared-nodes-and-cancellation (U), #the-tabular-toy",
        f"pooled |P(verbose)-0.5| of response-coupled objectives > step-constant ones, p < {ALPHA} "
        "Holm-adjusted over the outcomes of the class comparison (its section below).",
        check_family_drift,
    ),
    Claim(
        "C3",
        "DFPO transforms: Min-Replace on the IS factor cancels without drift; Orth cancels on "
        "group-common prefixes but still drifts; Min-Replace over s_i/l_i over-corrects",
        "arXiv 2604.13088 v1 Eq. 17-18 as this project reads them (docs/objectives.md#dfpo-transforms): "
        "`dfpo_min` (Min-Replace on the importance factor with a constant normaliser) and the "
        "over-correction predicted for Min-Replace over s_i/l_i (`dfpo_min_seqlen`) are the project's reading "
        "of DFPO, not the authors' code or claims. A threshold rule, no test",
        "dfpo_min: D1 <= 1e-4 and |P(verbose)-0.5| < 0.25; dfpo_orth: |P(verbose)-0.5| >= 0.25; "
        "dfpo_min_seqlen: P(verbose) > 0.9 or < 0.1.",
        check_dfpo,
    ),
    Claim(
        "C4",
        "The sign-dependent PPO clip alone breaks cancellation once it bites",
        "arXiv 2604.13088 v1 (asymmetric clipping); docs/objectives.md#sign-dependent-clipping",
        f"in the high-lr / 8-epoch setting where the gate bites (else the main setting), D1 of dr_grpo (PPO clip) > "
        f"D1 of dr_grpo_symgate (same objective, sign-independent gate; else cp_grpo), p < {ALPHA}{_HOLM}; two "
        f"D1 values both <= {EXACT:g} (rounding) count as no difference, and where the clip never bit the claim "
        "is not testable.",
        check_clip,
    ),
    Claim(
        "C5",
        "Learning tax: non-cancelling updates spill over to unrelated contexts (probe drift)",
        "paper abstract ('learning tax'); docs/objectives.md#what-cancellation-does-not-fix, docs/diagnostics.md#not-computed-by-rlcore",
        f"probe KL larger under grpo than cp_grpo, p < {ALPHA}{_HOLM}.",
        check_spillover,
    ),
    Claim(
        "C6",
        "Non-cancellation accelerates entropy collapse on shared tokens",
        "paper abstract and Fig. 1 ('entropy collapse'); docs/diagnostics.md#d7-entropy-by-position",
        f"common-prefix entropy lower under grpo than cp_grpo, p < {ALPHA}{_HOLM}.",
        check_entropy,
    ),
    Claim(
        "C7",
        "Equivalent solutions drift apart faster without cancellation",
        "paper Cor. 3.2; docs/objectives.md#what-cancellation-does-not-fix (rich-get-richer exists even with cancellation)",
        f"equivalent-solution log-odds drift larger under grpo than cp_grpo, p < {ALPHA}{_HOLM}.",
        check_equiv,
    ),
    Claim(
        "C8",
        "The fixes cost no sample efficiency (paper: DFPO reaches the threshold at 0.91x GSPO's compute)",
        "paper Table 2; docs/objectives.md#the-tabular-toy",
        "cp_grpo and dfpo_min need at most 1.1x grpo's steps to the "
        "accuracy threshold (a run that never reaches it counts as the step budget); a descriptive rule, no "
        "test (the class comparison below tests the steps).",
        check_efficiency,
    ),
    Claim(
        "C9",
        "The benefit grows with the group size (paper Table 4: +3.1 at G=2 to +5.7 at G=16)",
        "paper Table 4",
        "the grpo - cp_grpo drift gap is non-decreasing in G and larger at the largest G; a descriptive rule on "
        "the mean gaps, no test of the trend.",
        check_group_size,
    ),
    Claim(
        "C10",
        "Splitting a group across optimizer steps breaks cancellation even for exchangeable objectives",
        "docs/objectives.md#step-constant-normalisers; arXiv 2605.08666",
        f"cp_grpo's per-step D1 <= {EXACT:g} with whole groups and >= 0.05 with split groups in every run.",
        check_split,
        by_construction=True,
    ),
    Claim(
        "C11",
        "The drift does not need off-policy epochs (it is the coefficient, not the clip)",
        "docs/objectives.md#length-normalisation (the coefficient, not the clip)",
        f"with 1 epoch, grpo's drift > cp_grpo's, p < {ALPHA}{_HOLM}.",
        check_epochs,
    ),
    Claim(
        "C12",
        "On a real model through the real trainer, grpo leaves a residual and cp_grpo cancels",
        "project claim (README)",
        "cp_grpo D2 <= 1e-4 < grpo D2 (D1 where D2 was not recorded).",
        check_trainer,
        by_construction=True,
    ),
]


def _checked(claim: Claim, view: View) -> Finding | None:
    """The claim's finding on one testbed; for a part-run study, with the runs it rests on and what has not run."""
    view.requests = []
    finding = claim.check(view)
    ran, missing = view.provenance()
    if view.missing_runs() <= 0 or not (ran or missing):
        return finding
    if finding is None:
        if not missing:
            return None
        finding = Finding(view.testbed, "not run yet", "None of the conditions this claim needs has run yet.")
    runs = sum(len(c["seeds"]) for c in ran)
    by_seeds: dict[str, list[str]] = {}
    for c in ran:
        by_seeds.setdefault(_seed_list(c["seeds"]), []).append(_cond_name(c))
    parts = "; ".join(", ".join(names) + f": seeds {seeds}" for seeds, names in by_seeds.items())
    text = f"*Data: {runs} runs* ({parts})" if ran else "*Data: none*"
    short = [
        f"{_cond_name(c)}: {_seed_list(sorted(set(view.results['seeds']) - set(c['seeds'])))}"
        for c in ran
        if len(c["seeds"]) < view.n_seeds()
    ]
    if short:
        text += f". *Seeds not run yet:* {'; '.join(short)}"
    if missing:
        text += (
            f". *Not run yet* (no results, not shown): {', '.join(_cond_name(c) for c in missing)}, "
            f"{view.n_seeds()} seeds each"
        )
    finding.data = text + "."
    if ran:
        finding.note = f" ({runs} run{'s' * (runs != 1)}{', partial' if missing or short else ''})"
    return finding


def _cond_name(c: dict[str, Any]) -> str:
    return c["objective"] if c["group"] == "main" else f"{c['objective']} ({c['label']})"


def _seed_list(seeds: list[int]) -> str:
    seeds = sorted(s for s in seeds if s is not None)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


# -- figures --------------------------------------------------------------------------------------------
def figures(results: dict[str, dict[str, Any]], out_dir: Path) -> dict[str, list[Path]]:
    figs: dict[str, list[Path]] = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    for testbed, res in results.items():
        name = res["study"]
        paths = []
        if testbed == "tabular":
            paths.append(
                plots.bar_figure(
                    res,
                    [
                        ("p_verbose", "P(verbose) final (reward-irrelevant, init .5)", 0.5),
                        ("cancel_resid", "D1 cancellation residual", None),
                        ("t75", "steps to success .75", None),
                        ("success", "final success", None),
                        ("template_drift", "template |log-odds drift|", None),
                        ("filler_entropy", "filler entropy (init ln 3)", 1.0986),
                        ("solution_logodds", "equivalent-solution |log-odds|", None),
                        ("diag/d7_entropy_common", "entropy on common prefix (D7)", None),
                    ],
                    out_dir / f"{name}_main.png",
                    title="Testbed 1: tabular toy, main setting (mean ± s.e.)",
                )
            )
            paths.append(
                plots.curve_figure(
                    res,
                    [
                        ("p_verbose", "P(verbose)", 0.5),
                        ("success", "success", None),
                        ("diag/d1_gcpr", "D1 residual", None),
                        ("template_drift", "template drift", None),
                    ],
                    out_dir / f"{name}_curves.png",
                    title="Testbed 1: training curves (dashed: does not preserve)",
                )
            )
            panels = [
                (g, key, f"{g}: {lab}", ref)
                for g in ("epochs", "split", "group_size")
                for key, lab, ref in (("cancel_resid", "D1", None), ("p_verbose", "P(verbose)", 0.5))
                if any(c["group"] == g for c in res["conditions"])
            ]
            if panels:
                paths.append(
                    plots.ablation_figure(
                        res, panels, out_dir / f"{name}_ablations.png", title="Testbed 1: ablations", cols=2
                    )
                )
        elif testbed == "tinylm":
            paths.append(
                plots.bar_figure(
                    res,
                    [
                        ("eval/p_verbose", "P(verbose) final (init .5)", 0.5),
                        ("diag/d1_gcpr", "D1 cancellation residual", None),
                        ("probe/kl", "probe KL to init (D5, unrelated contexts)", None),
                        ("eval/accuracy", "final accuracy (exact)", None),
                        ("eval/steps_to_threshold", "steps to accuracy threshold", None),
                        ("eval/template_drift", "template |log-odds drift|", None),
                        ("eval/equiv_drift", "equivalent-solution log-odds drift", None),
                        ("diag/d7_entropy_common", "entropy on common prefix (D7)", None),
                        ("rollout/length_correct", "length of correct responses", None),
                        ("rollout/length_wrong", "length of wrong responses", None),
                        ("rollout/entropy_forking", "entropy of forking tokens (top 20%)", None),
                        ("diag/d7_entropy_mean", "mean token entropy", None),
                    ],
                    out_dir / f"{name}_main.png",
                    title="Testbed 2: tiny LM, main setting (mean ± s.e.)",
                )
            )
            paths.append(
                plots.curve_figure(
                    res,
                    [
                        ("eval/accuracy", "accuracy", None),
                        ("eval/p_verbose", "P(verbose)", 0.5),
                        ("probe/kl", "probe KL (D5)", None),
                        ("diag/d1_gcpr", "D1 residual", None),
                        ("rollout/length_correct", "length, correct", None),
                        ("rollout/length_wrong", "length, wrong", None),
                        ("eval/template_drift", "template drift", None),
                        ("diag/d7_entropy_mean", "entropy", None),
                    ],
                    out_dir / f"{name}_curves.png",
                    title="Testbed 2: training curves (dashed: does not preserve)",
                )
            )
            panels = [
                (g, key, f"{g}: {lab}", ref)
                for g in ("epochs", "split", "group_size")
                for key, lab, ref in (
                    ("diag/d1_gcpr", "D1", None),
                    ("eval/p_verbose", "P(verbose)", 0.5),
                    ("probe/kl", "probe KL", None),
                )
                if any(c["group"] == g for c in res["conditions"])
            ]
            if panels:
                view = View(res)
                part = (
                    f" (part-run study: {len(view.planned()) * view.n_seeds() - view.missing_runs()} of "
                    f"{len(view.planned()) * view.n_seeds()} runs; seeds per condition in REPORT.md)"
                    if view.missing_runs() > 0
                    else ""
                )
                paths.append(
                    plots.ablation_figure(
                        res,
                        panels,
                        out_dir / f"{name}_ablations.png",
                        title="Testbed 2: ablations" + part,
                        cols=3,
                    )
                )
        elif testbed == "trainer":
            for group, task in trainer_tasks(res):
                if not any(c["group"] == group for c in res["conditions"]):
                    continue
                paths.append(
                    plots.curve_figure(
                        res,
                        [
                            ("reward/accuracy", "accuracy", None),
                            ("diag/d2_residual", "D2 residual (shared nodes)", None),
                            ("diag/d7_entropy_mean", "entropy", None),
                            ("response/length_mean", "length", None),
                        ],
                        out_dir / (f"{name}_curves.png" if group == "main" else f"{name}_{task}_curves.png"),
                        group=group,
                        title=f"Testbed 3: {res['base'].get('model', 'model')} through the real "
                        f"trainer, {task}",
                    )
                )
        figs[testbed] = paths
    return figs


# -- markdown -------------------------------------------------------------------------------------------
RELATED_WORK = [
    "## Related work",
    "",
    "Several effects this report measures were described before the cancellation paper (arXiv 2604.13088), "
    "and its results read best beside them. Dr. GRPO (arXiv 2503.20783) showed that GRPO's per-response "
    "1/|o_i| biases length: a wrong answer's tokens are pushed down less the longer it is, and a right "
    "answer's pushed up more the shorter it is, so wrong answers lengthen; the drift of testbeds 1-2's "
    "reward-irrelevant verbose style, a choice that only adds tokens, is that bias, and the length-bias rows "
    "take their predicted direction from it. DAPO (arXiv 2503.14476) normalises by the step's token count "
    "(`token_mean`, step-constant, so it keeps cancellation) and raises the upper clip bound against entropy "
    "collapse. The entropy-mechanism study (arXiv 2505.22617) ties entropy collapse to the covariance "
    "between a token's probability and its advantage, which acts with exact cancellation too (the "
    "rich-get-richer drift of C7). The spurious-rewards study (arXiv 2506.10947) saw one model family gain "
    "on math benchmarks from random or wrong rewards and others not, and traced part of it to the clip "
    "favouring behaviour the model already preferred: a sign-dependent clip (C4) shapes what a policy "
    "learns whatever the reward, and a gain on one model family is weak evidence about another.",
    "",
]


def _table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _setup(results: dict[str, dict[str, Any]]) -> list[str]:
    out = ["## What ran", ""]
    for testbed, res in results.items():
        n_runs = sum(len(c["seeds"]) for c in res["conditions"])
        secs = sum(s for c in res["conditions"] for s in c["seconds"] if s)
        seeds = sorted({s for c in res["conditions"] for s in c["seeds"] if s is not None})
        out.append(
            f"- **{TESTBEDS[testbed]}**, study `{res['study']}` ({res['size']} size, results of "
            f"{res['created']}): {len(res['conditions'])} conditions, {n_runs} runs, seeds {seeds}, "
            f"{secs / 60:.0f} min of run time in total. Main setting: "
            + ", ".join(f"{k}={v}" for k, v in res["base"].items())
            + f". Rerun: `{res['command']}`."
        )
        view = View(res)
        if view.missing_runs() > 0:
            ran = {c["key"]: c for c in res["conditions"]}
            partial = [
                f"{_cond_name(c)} ({_seed_list(c['seeds'])})"
                for c in res["conditions"]
                if len(c["seeds"]) < view.n_seeds()
            ]
            absent = [_cond_name(c) for c in view.planned() if c["key"] not in ran]
            out.append(
                f"  **Part-run study:** {n_runs} of {len(view.planned()) * view.n_seeds()} planned runs "
                f"({len(view.planned())} conditions x {view.n_seeds()} seeds) have run."
                + (
                    f" Conditions with fewer than {view.n_seeds()} seeds (seeds that ran): "
                    f"{', '.join(partial)}."
                    if partial
                    else ""
                )
                + (
                    f" Not run yet, so absent from every table and figure: {', '.join(absent)}."
                    if absent
                    else ""
                )
                + (
                    " Each run's summary is kept beside the results (`trainer_runs/`), so on any machine"
                    if testbed == "trainer"
                    else " The cache resumes the study:"
                )
                + f" `{res['command']}` runs only what is missing, and "
                f"`--objectives`, `--{'tasks' if testbed == 'trainer' else 'groups'}`, `--seeds` run a part of it."
            )
    return [*out, ""]


def render(
    results: dict[str, dict[str, Any]],
    fig_paths: dict[str, list[Path]],
    report_dir: Path,
    preamble: str = "",
    notes: str = "",
    sections: list[str] | None = None,
    columns: dict[str, tuple[dict[str, str], str]] | None = None,
    construction_notes: list[str] | None = None,
) -> str:
    """`sections`: markdown lines of studies outside the claim table (IBPO, testbed 4), placed before the
    figures; `columns`: more summary-table columns from such studies (name -> (claim ident -> cell, a note
    printed under the table)); a column without cells is left out; `construction_notes`: lines under the
    by-construction summary from such studies (the IBPO mask verdict)."""
    columns = {name: column for name, column in (columns or {}).items() if column[0]}
    views = {t: View(r) for t, r in results.items()}
    lines = [
        "# Token gradient cancellation at small scale: experiment report",
        "",
        f"Generated by `python -m experiments report` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        "from the results files next to this report. Numbers are means ± standard errors over seeds; "
        "a difference between two conditions is reported as the mean difference with its 95% confidence "
        "interval (Welch's t) and the p-value of an exact two-sided permutation test over seeds (with 5 seeds "
        "per side the smallest possible p is 0.008; with 3, 0.1). One multiplicity standard holds everywhere: "
        "Holm's adjustment over each testbed's family of tests (its claims tested as one objective against "
        "another, mostly grpo - cp_grpo; the class "
        'comparison of its outcomes), as in testbed 4. A difference that does not pass reads "n.s." with '
        "the direction it points; it is not evidence of no effect. Verdicts follow the rule printed under "
        "each claim.",
        "",
    ]
    if preamble:
        lines += [preamble.strip(), ""]
    findings: dict[str, list[Finding]] = {}
    for claim in CLAIMS:
        findings[claim.ident] = [f for v in views.values() if (f := _checked(claim, v)) is not None]
    for t in views:
        adjust_family([f for ident in PAIR_FAMILY for f in findings[ident] if f.testbed == t])
    header = [
        "| claim | " + " | ".join([*(TESTBEDS[t].split(" (")[0] for t in views), *columns]) + " |",
        "|---|" + "---|" * (len(views) + len(columns)),
    ]

    def summary_rows(by_construction: bool) -> list[str]:
        out = []
        for claim in (c for c in CLAIMS if c.by_construction == by_construction):
            cells = []
            for t in views:
                f = next((f for f in findings[claim.ident] if f.testbed == t), None)
                cells.append("—" if f is None else f"{f.verdict}{f.note}")
            cells += [extra.get(claim.ident, "—") for extra, _ in columns.values()]
            out.append(f"| {claim.ident}: {claim.title} | " + " | ".join(cells) + " |")
        return out

    lines += [
        "## Summary",
        "",
        "### Results that hold by construction",
        "",
        "These follow from the loss algebra (docs/objectives.md): whether a residual is left on shared tokens "
        "is decided by the objective's coefficients, so a run confirms that the code computes what the "
        "derivation says. They are checks of the implementation and of the diagnostics, not evidence that "
        "cancellation changes how training goes.",
        "",
        *header,
        *summary_rows(True),
        "",
        *(construction_notes or []),
        "### Empirical results",
        "",
        "What training did, claim by claim (verdicts Holm-adjusted as stated above). Most rest on testbeds "
        "built to show the mechanism (a tabular toy and a tiny LM whose reward-irrelevant choice is a length)."
        + "".join(_passed_sentence(name, cells) for name, (cells, _) in columns.items()),
        "",
        *header,
        *summary_rows(False),
    ]
    lines += ["", "— : not measured on that testbed (no such metric or condition there)."]
    lines += [note for _, note in columns.values()]
    for t, v in views.items():
        if v.missing_runs() > 0:
            lines += [
                f"{TESTBEDS[t]} is a part-run study: {v.missing_runs()} of its {len(v.planned()) * v.n_seeds()} "
                f'planned runs have not run yet. Its verdicts give the number of runs they rest on ("partial": '
                f'some runs the claim needs have not run; "not run yet": none has), and each finding '
                f"below lists its runs and the conditions that have not run."
            ]
    lines += [""]
    lines += _setup(results)
    lines += RELATED_WORK
    if notes:
        lines += ["## Reading the results", "", notes.strip(), ""]
    lines += ["## Claims", ""]
    for claim in CLAIMS:
        lines += [f"### {claim.ident}. {claim.title}", "", f"Source: {claim.source}. Rule: {claim.rule}", ""]
        if not findings[claim.ident]:
            lines += ["Not measured by the studies in this report.", ""]
        for f in findings[claim.ident]:
            lines += [f"**{TESTBEDS[f.testbed]}: {f.verdict.rstrip('.')}.** {f.text}", ""]
            if f.table:
                lines += [_table(f.table), ""]
            if f.data:
                lines += [f.data, ""]
    lines += class_section(views)
    lines += sections or []
    lines += ["## Figures", ""]
    for testbed, paths in fig_paths.items():
        for p in paths:
            rel = (
                Path(p).resolve().relative_to(report_dir.resolve())
                if Path(p).resolve().is_relative_to(report_dir.resolve())
                else Path(p)
            )
            lines += [f"![{TESTBEDS[testbed]}: {Path(p).stem}]({rel.as_posix()})", ""]
    lines += ["## Rerun", "", "```bash"]
    for res in results.values():
        lines.append(
            f"nice -n 10 .venv/bin/{res['command'].replace('python', 'python', 1)}   # {TESTBEDS[res['testbed']]}"
        )
    lines += [
        ".venv/bin/python -m experiments testbed4 --commit   # Testbed 4 (~35 min a run; finished runs are skipped)",
        ".venv/bin/python -m experiments testbed5 pilot --commit   # Testbed 5's pilot, then `testbed5 study --commit`",
        ".venv/bin/python -m experiments report   # figures and this report from experiments/results/",
        ".venv/bin/python -m experiments ci       # the CI-sized version of testbeds 1-2 (minutes)",
        "```",
        "",
    ]
    return "\n".join(lines)


def _passed_sentence(column: str, cells: dict[str, str]) -> str:
    """What a study outside the claim table showed on the empirical claims: those whose cell passed its test
    either way, or that none did (then the dose, in its section, says how strong a test that was)."""
    empirical = {c.ident for c in CLAIMS if not c.by_construction}
    passed = [
        i for i, cell in cells.items() if i in empirical and cell.startswith(("reproduced", "opposite"))
    ]
    if passed:
        return f" {column}: " + ", ".join(i + " " + cells[i].split(" (")[0] for i in passed) + "."
    return (
        f" {column}: no empirical claim passed its test; its section gives the dose of the mechanism those "
        "runs had."
    )


def write_report(
    results_dir: Path, report_path: Path, preamble: str = "", notes_path: Path | None = None
) -> Path:
    """Figures into `results_dir`, markdown into `report_path`; returns the report path."""
    results = load_results(results_dir)
    if not results:
        raise FileNotFoundError(
            f"no results files in {results_dir}; run a study first (python -m experiments ci)"
        )
    figs = figures(results, Path(results_dir))
    notes = notes_path.read_text() if notes_path is not None and notes_path.exists() else ""
    sections = ibpo_report.section(Path(results_dir) / "ibpo", Path(results_dir), report_path.parent)
    testbed4_lines, testbed4_cells = testbed4_report.section(
        Path(results_dir) / "testbed4_runs", Path(results_dir), report_path.parent
    )
    sections += testbed4_lines
    sections += testbed5_report.section(Path(results_dir) / "testbed5_runs", Path(results_dir) / "testbed5")
    columns = {"Testbed 4": (testbed4_cells, testbed4_report.SUMMARY_NOTE)}
    mask = ibpo_report.mask_summary(Path(results_dir) / "ibpo")
    report_path.write_text(
        render(results, figs, report_path.parent, preamble, notes, sections, columns, mask)
    )
    return report_path
