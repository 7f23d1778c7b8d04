"""The order of the test files, which is also the order the xdist controller hands them out in.

In one process (`TGC_TEST_WORKERS=0`) the files run longest first, the image tests once the build had time.
Under xdist the controller follows the collection's order (tests/conftest.py turns xdist's own reordering off),
and for two or more workers that order is xdist's own (files with more tests first) with one change: the two
longest files of one long test each (FIRST_UNDER_XDIST) go first, one after the other on one worker. By number
of tests they came last and ran side by side at ~40 min, each about twice as slow beside the other Ray job
(NOTES.md, seventeenth session). Handing every long file out first was measured worse: it put two Ray jobs on
the two cores at once for most of the run, and the suite took 62 min instead of ~50 (fifteenth session).

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
# The learning test and the two-node node-loss test (~450 s and ~315 s of the last timed CI run, each its
# file's one long test): under xdist the first goes to one worker at the start and the second right behind it
# on the same worker, so each overlaps the other worker's files of many quick tests, never the other Ray job.
FIRST_UNDER_XDIST = ("tests/trainer/test_learning.py", "tests/ops/test_two_nodes.py")


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
    """Sorts `items` in place, whole files: longest first, the image tests after the head start; for two or
    more workers then `xdist_order` of that."""
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
    if workers > 1:
        order = xdist_order(order, {f: len(its) for f, its in by_file.items()}, workers)
    items[:] = [item for f in order for item in by_file[f]]


def xdist_order(order: list[str], tests: dict[str, int], workers: int) -> list[str]:
    """xdist's own order of `order` (more tests first, equal counts as they were), FIRST_UNDER_XDIST at the head
    of worker 0's queue. xdist's file scheduler gives the first `workers` files one to each worker, then one more
    to each worker holding two tests or fewer: the learning test's one test, so the file at index `workers`
    follows it on worker 0 while the other workers start on the files with the most tests."""
    order = sorted((f for f in order if f not in FIRST_UNDER_XDIST), key=lambda f: -tests[f])
    for i, f in enumerate(f for f in FIRST_UNDER_XDIST if f in tests):
        order.insert(i * workers, f)
    return order


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
