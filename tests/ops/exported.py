"""Which metric names a PromQL expression reads that the code exports nowhere (the dashboard's and the alert
rules' queries are checked against the source the same way)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@cache
def _sources() -> str:
    return "".join(p.read_text() for p in (ROOT / "services").rglob("*.py"))


def unexported(expr: str) -> list[str]:
    """The tgc_ series (Ray's exporter adds `ray_`; counters and histograms their suffixes) and the per-step
    metric names (`metric="..."` or `metric=~"a|b"`) of `expr` that no module under services/ defines."""
    sources = _sources()
    missing = []
    for name in re.findall(r"\b(?:ray_)?(tgc_[a-z_]+)", expr):
        if f'"{re.sub(r"_(total|bucket|sum|count)$", "", name)}"' not in sources:
            missing.append(name)
    for listed in re.findall(r'metric=~?"([^"]+)"', expr):
        for key in listed.split("|"):
            # pool stats are prefixed on the way (`rollout/` + "sync_s")
            if f'"{key}"' not in sources and f'"{key.split("/")[-1]}"' not in sources:
                missing.append(key)
    return missing
