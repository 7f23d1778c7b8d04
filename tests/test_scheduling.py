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


def test_under_two_workers_the_two_longest_files_start_first_one_after_the_other_on_one_worker(pytestconfig):
    from xdist.scheduler import LoadFileScheduling

    learning, two_nodes = scheduling.FIRST_UNDER_XDIST
    assert (
        Path(learning).is_file() and Path(two_nodes).is_file()
    )  # renamed: the rule would silently not apply
    counts = {"many.py": 40, learning: 1, "some.py": 9, two_nodes: 2, "other_long.py": 1, "few.py": 3}
    items = [Item(f"{f}::t{n}", slow=f != "many.py") for f, k in counts.items() for n in range(k)]
    recorded = {"other_long.py": 250.0, learning: 450.0, two_nodes: 400.0, "many.py": 20.0}
    scheduling.order_files(items, workers=2, recorded=recorded)
    # xdist's own order (more tests first) but for the two, which go to positions 0 and 2; the other one-test
    # long file is not moved (handing every long file out first was measured worse)
    assert files(items) == [learning, "many.py", two_nodes, "some.py", "few.py", "other_long.py"]

    # xdist's real file scheduler, with the reordering as this session's conftest configured it
    sched = LoadFileScheduling(ControllerConfig(pytestconfig.option))
    workers = [Worker("gw0"), Worker("gw1")]
    ids = [i.nodeid for i in items]
    for w in workers:
        sched.add_node(w)  # type: ignore[arg-type]
        sched.add_node_collection(w, ids)  # type: ignore[arg-type]
    sched.schedule()
    handed = [[{scheduling.file_of(ids[i]) for i in unit} for unit in w.sent] for w in workers]
    assert handed == [[{learning}, {two_nodes}], [{"many.py"}]]
    for i in workers[0].sent[0]:  # the learning test ends: its worker takes the next file of the queue
        sched.mark_test_complete(workers[0], i)  # type: ignore[arg-type]
    assert {scheduling.file_of(ids[i]) for i in workers[0].sent[-1]} == {"some.py"}


def test_one_worker_keeps_the_longest_first_order_without_moving_the_two():
    learning, two_nodes = scheduling.FIRST_UNDER_XDIST
    items = [Item("long.py::t", slow=True), Item(f"{two_nodes}::a"), Item(f"{learning}::t")]
    scheduling.order_files(items, workers=1, recorded={"long.py": 900.0, two_nodes: 400.0, learning: 450.0})
    assert files(items) == ["long.py", learning, two_nodes]
