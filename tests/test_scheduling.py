"""The order test files are handed to the workers in (tests/scheduling.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
    scheduling.order_files(items, workers=2, recorded={"a.py": 5.0, "b.py": 300.0, "c.py": 40.0})
    assert [i.nodeid for i in items] == ["b.py::t1", "b.py::t2", "c.py::t1", "a.py::t1", "a.py::t2"]


def test_a_file_with_one_long_slow_test_goes_before_a_file_of_many_quick_ones():
    # xdist's own order (by number of tests) hands the one-test file out last; the estimate does not
    items = [Item(f"many.py::t{n}") for n in range(50)] + [Item("one.py::t", slow=True)]
    scheduling.order_files(items, workers=2, recorded={})
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
