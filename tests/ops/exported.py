"""Which metric names a PromQL expression reads that the code exports nowhere (the dashboard's and the alert
rules' queries are checked the same way): per-step metrics against the run contract's list
(tgc_rl/run_layout.py), the control plane's own tgc_ series against the source that defines them."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from tgc_rl.run_layout import METRIC_GAUGE, STEP_GAUGE, WATCHED_METRICS

ROOT = Path(__file__).resolve().parents[2]


@cache
def _sources() -> str:
    return "".join(p.read_text() for p in (ROOT / "tgc_rl").rglob("*.py"))


def unexported(expr: str) -> list[str]:
    """The tgc_ series (Ray's exporter adds `ray_`; counters and histograms their suffixes) and the per-step
    metric names (`metric="..."` or `metric=~"a|b"`) of `expr` that the code does not export."""
    missing = []
    for name in re.findall(r"\b(?:ray_)?(tgc_[a-z_]+)", expr):
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        if base not in (STEP_GAUGE, METRIC_GAUGE) and f'"{base}"' not in _sources():
            missing.append(name)
    for listed in re.findall(r'metric=~?"([^"]+)"', expr):
        missing += [key for key in listed.split("|") if key not in WATCHED_METRICS]
    return missing
