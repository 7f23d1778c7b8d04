"""The order of the test files, which is also the order the xdist controller hands them out in: longest first
(LPT), the image tests once the build had time.

Under xdist each worker runs on its own share of the CPUs (tests/conftest.py pins it, and everything it starts
inherits the pin), so two Ray jobs on two workers no longer slow each other down beyond sharing the machine, and
longest first keeps the tail short. Unpinned, longest first had measured worse: it put two Ray jobs side by side
for most of the run, and torch's OpenMP threads of the two (each job's actors set as many as the host has cores)
waited at every barrier for a thread the other job had descheduled (62 min instead of ~50, fifteenth session;
the barrier waits measured in the twentieth, NOTES.md).

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
    """Sorts `items` in place, whole files: longest first, the image tests after `workers` x the head start."""
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


def pin_worker(worker: int, workers: int) -> list[int]:
    """Restricts this process, and every process it starts from now on (Ray, vLLM, servers, subprocesses), to
    worker `worker`'s share of the CPUs it may use: every `workers`-th from its index (one CPU on the 2-core CI
    machine), or one shared CPU when there are more workers than CPUs. torch sizes its thread pool by this
    mask, and tgc-rl's actors cap their threads by it (tgc_rl/startup.py)."""
    cpus = sorted(os.sched_getaffinity(0))
    mine = cpus[worker::workers] or [cpus[worker % len(cpus)]]
    os.sched_setaffinity(0, mine)
    return mine


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
