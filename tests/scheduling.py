"""The order of the test files: longest first, the image tests once the build had time.

In one process (`TGC_TEST_WORKERS=0`) this is the order the files run in. Under pytest-xdist, scripts/test.sh
keeps xdist's own order (files with many tests first): handing the longest files out first put two Ray jobs on
the two cores at once for most of the run, each about twice as slow, and the suite took 62 min instead of ~50
(measured on the AVX2 kind, NOTES.md); `--no-loadscope-reorder` makes xdist follow this order instead.

A file's cost is its duration recorded by an earlier full run (tests/durations.json: setup, call and teardown
of its tests, summed; `TGC_RECORD_DURATIONS=path` writes one, scripts/test.sh to test-artifacts/) or, for a
file not recorded, an estimate from how many of its tests are marked slow. The image tests wait on the image
built in the background (tests/image_build.py), so they are placed after enough work for the build to finish
on a new machine.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from tests.image_build import IMAGE_TESTS

RECORDED = Path(__file__).with_name("durations.json")
RECORD_VAR = "TGC_RECORD_DURATIONS"
# Estimates for a file no run has recorded yet.
SLOW_TEST_S = 30.0
FAST_TEST_S = 0.3
# The background image build takes ~10 min on a new machine (downloads, unpacking): the image tests start after
# this much work per worker.
IMAGE_BUILD_HEAD_START_S = 900.0


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded_durations(path: Path = RECORDED) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def estimated_cost(items: list) -> float:
    return sum(SLOW_TEST_S if item.get_closest_marker("slow") else FAST_TEST_S for item in items)


def order_files(items: list, workers: int, recorded: dict[str, float] | None = None) -> None:
    """Sorts `items` in place: whole files, longest first, the image tests after the head start."""
    recorded = recorded_durations() if recorded is None else recorded
    by_file: dict[str, list] = defaultdict(list)
    for item in items:
        by_file[file_of(item.nodeid)].append(item)
    cost = {f: recorded.get(f, estimated_cost(its)) for f, its in by_file.items()}
    order = sorted(by_file, key=lambda f: -cost[f])  # stable: equal costs keep the collection order
    if IMAGE_TESTS in by_file:
        order.remove(IMAGE_TESTS)
        ahead, at = 0.0, len(order)
        for i, f in enumerate(order):
            if ahead >= IMAGE_BUILD_HEAD_START_S * max(workers, 1):
                at = i
                break
            ahead += cost[f]
        order.insert(at, IMAGE_TESTS)
    items[:] = [item for f in order for item in by_file[f]]


class DurationRecorder:
    """Sums each file's setup, call and teardown times from the reports; written at the session's end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, report) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ordered = dict(sorted(((f, round(s, 1)) for f, s in self.seconds.items()), key=lambda kv: -kv[1]))
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")


def recorder_from_environment() -> DurationRecorder | None:
    path = os.environ.get(RECORD_VAR)
    return DurationRecorder(Path(path)) if path else None
