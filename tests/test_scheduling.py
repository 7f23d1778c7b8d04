"""The order test files are handed to the workers in (tests/scheduling.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from tests import scheduling
from tests.image_build import IMAGE_TESTS


@dataclass
class Item:
    nodeid: str
    slow: bool = False

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None


@dataclass
class Report:
    nodeid: str
    duration: float


def files(items: list[Item]) -> list[str]:
    return list(dict.fromkeys(scheduling.file_of(i.nodeid) for i in items))


def test_recorded_files_go_longest_first_and_keep_their_tests_together_in_order():
    items = [Item("a.py::t1"), Item("b.py::t1"), Item("a.py::t2"), Item("c.py::t1"), Item("b.py::t2")]
    scheduling.order_files(items, workers=1, recorded={"a.py": 5.0, "b.py": 300.0, "c.py": 40.0})
    assert [i.nodeid for i in items] == ["b.py::t1", "b.py::t2", "c.py::t1", "a.py::t1", "a.py::t2"]


def test_a_file_with_one_long_slow_test_goes_before_a_file_of_many_quick_ones():
    # in one process; xdist's own order (by number of tests) hands the one-test file out last
    items = [Item(f"many.py::t{n}") for n in range(50)] + [Item("one.py::t", slow=True)]
    scheduling.order_files(items, workers=1, recorded={})
    assert files(items) == ["one.py", "many.py"]


def test_a_recorded_duration_wins_over_the_estimate():
    items = [Item("slowmarked.py::t", slow=True), Item("quick_but_long.py::t")]
    scheduling.order_files(items, workers=2, recorded={"quick_but_long.py": 200.0})
    assert files(items) == ["quick_but_long.py", "slowmarked.py"]


def test_the_image_tests_wait_for_the_builds_head_start_per_worker():
    head = scheduling.IMAGE_BUILD_HEAD_START_S
    recorded = {IMAGE_TESTS: 10_000.0, "x.py": head, "y.py": head, "z.py": head / 2, "w.py": 1.0}
    items = [Item(f"{f}::t") for f in recorded]
    scheduling.order_files(items, workers=2, recorded=recorded)
    # longest first, but the image tests only once 2 workers x the head start is ahead of them
    assert files(items) == ["x.py", "y.py", IMAGE_TESTS, "z.py", "w.py"]
    scheduling.order_files(items, workers=4, recorded=recorded)  # not enough work ahead: last
    assert files(items)[-1] == IMAGE_TESTS


def test_the_recorder_sums_each_files_phases_and_the_next_run_reads_it(tmp_path: Path):
    rec = scheduling.DurationRecorder(tmp_path / "out" / "durations.json")
    for nodeid, d in [("a.py::t1", 1.0), ("a.py::t1", 2.5), ("b.py::t[x]", 4.0), ("a.py::t2", 0.25)]:
        rec.add(Report(nodeid, d))
    rec.write()
    assert json.loads(rec.path.read_text()) == {"b.py": 4.0, "a.py": 3.8}
    assert scheduling.recorded_durations(rec.path) == {"b.py": 4.0, "a.py": 3.8}
    (tmp_path / "bad.json").write_text("[1, 2")
    assert scheduling.recorded_durations(tmp_path / "bad.json") == {}  # a broken file: estimates instead


class Worker:
    """What xdist's file scheduler uses of a worker: the tests it is sent, in order, and its shutdown."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


class ControllerConfig:
    """The controller's config as xdist's scheduler reads it: this session's options, two workers."""

    def __init__(self, option) -> None:
        self.option = option

    def getvalue(self, name: str):
        return {"tx": ["2*popen"]}[name]


def test_under_two_workers_the_longest_files_start_first_one_on_each_and_a_free_worker_takes_the_next(
    pytestconfig,
):
    from xdist.scheduler import LoadFileScheduling

    counts = {
        "many.py": 40,
        "learning.py": 1,
        "some.py": 9,
        "two_nodes.py": 2,
        "other_long.py": 1,
        "few.py": 3,
    }
    items = [Item(f"{f}::t{n}", slow=f != "many.py") for f, k in counts.items() for n in range(k)]
    recorded = {"other_long.py": 250.0, "learning.py": 450.0, "two_nodes.py": 400.0, "many.py": 20.0}
    scheduling.order_files(items, workers=2, recorded=recorded)
    # recorded costs, then estimates for the rest (30 s a slow test: some.py 270, few.py 90)
    assert files(items) == ["learning.py", "two_nodes.py", "some.py", "other_long.py", "few.py", "many.py"]

    # xdist's real file scheduler, with the reordering as this session's conftest configured it
    sched = LoadFileScheduling(ControllerConfig(pytestconfig.option))
    workers = [Worker("gw0"), Worker("gw1")]
    ids = [i.nodeid for i in items]
    for w in workers:
        sched.add_node(w)  # type: ignore[arg-type]
        sched.add_node_collection(w, ids)  # type: ignore[arg-type]
    sched.schedule()
    handed = [[{scheduling.file_of(ids[i]) for i in unit} for unit in w.sent] for w in workers]
    # one file each, then one more to each worker holding two tests or fewer, in the queue's order
    assert handed == [[{"learning.py"}, {"some.py"}], [{"two_nodes.py"}, {"other_long.py"}]]
    for i in workers[1].sent[1]:  # other_long.py ends: its worker takes the next file of the queue
        sched.mark_test_complete(workers[1], i)  # type: ignore[arg-type]
    for i in workers[1].sent[0][:1]:
        sched.mark_test_complete(workers[1], i)  # type: ignore[arg-type]
    assert {scheduling.file_of(ids[i]) for i in workers[1].sent[-1]} == {"few.py"}


def test_a_worker_is_pinned_to_its_own_cpus_and_what_it_starts_inherits_them():
    import os
    import subprocess
    import sys

    cpus = sorted(os.sched_getaffinity(0))
    code = (
        "import os, sys, subprocess; sys.path.insert(0, os.getcwd()); from tests import scheduling; "
        "mine = scheduling.pin_worker(int(sys.argv[1]), int(sys.argv[2])); "
        "child = subprocess.run([sys.executable, '-c', 'import os, torch; "
        "print(sorted(os.sched_getaffinity(0)), torch.get_num_threads())'], capture_output=True, text=True); "
        "print(mine, child.stdout.strip())"
    )
    run = lambda i, n: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code, str(i), str(n)], capture_output=True, text=True, check=True
    ).stdout.strip()
    mine = cpus[1::2] or [cpus[1 % len(cpus)]]
    assert run(1, 2) == f"{mine} {mine} {len(mine)}"  # the child's mask and torch's default threads
    assert run(len(cpus), len(cpus) + 1) == f"[{cpus[0]}] [{cpus[0]}] 1"  # more workers than CPUs: one each
