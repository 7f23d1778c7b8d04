"""benchmarks/long_tail.py's admission rule and its quantities, on a fake engine with a fake clock (no vLLM)."""

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "long_tail.py"
_SPEC = importlib.util.spec_from_file_location("long_tail", _PATH)
long_tail = importlib.util.module_from_spec(_SPEC)
sys.modules["long_tail"] = long_tail  # dataclasses look their module up while the file runs
_SPEC.loader.exec_module(long_tail)

FIXED_S, PER_REQUEST_S = 1.0, 0.25  # the fake engine's iteration cost: fixed + per running request


@dataclass
class FakeEngine:
    """Each iteration gives every running request one token (its length is its params) and advances the clock
    by FIXED_S + PER_REQUEST_S x running; records which requests ran beside each other."""

    now: float = 0.0
    running: dict[str, list[int]] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)
    added: list[tuple[str, set[str]]] = field(default_factory=list)  # (request id, those running when added)
    most_running: int = 0

    def clock(self) -> float:
        return self.now

    def add_request(self, request_id, prompt, params):
        self.added.append((request_id, set(self.running)))
        self.running[request_id] = []
        self.lengths[request_id] = params

    def get_num_unfinished_requests(self) -> int:
        return len(self.running)

    def step(self):
        self.most_running = max(self.most_running, len(self.running))
        self.now += FIXED_S + PER_REQUEST_S * len(self.running)
        out = []
        for rid, toks in list(self.running.items()):
            toks.append(len(toks))
            if len(toks) == self.lengths[rid]:
                del self.running[rid]
                done = SimpleNamespace(token_ids=toks, finish_reason="length" if len(toks) == 9 else "stop")
                out.append(SimpleNamespace(request_id=rid, finished=True, outputs=[done]))
        return out


def _requests(lengths_by_step: list[list[list[int]]]) -> list:
    """Requests of steps -> groups -> samples, each sample's params its length."""
    out, group = [], 0
    for step, groups in enumerate(lengths_by_step):
        for samples in groups:
            out += [long_tail.Request(len(out) + j, step, group, j, [1, 2], n) for j, n in enumerate(samples)]
            group += 1
    return out


# two steps of two groups of two: one long response a step (the tail), the rest short
STEPS = [[[2, 9], [2, 2]], [[3, 3], [9, 2]]]


def test_sequential_admits_a_step_only_after_the_previous_one_finished():
    engine = FakeEngine()
    w = long_tail.drive(engine, _requests(STEPS), batch=4, mode="sequential", clock=engine.clock)
    step0_ids = {str(r.id) for r in _requests(STEPS) if r.step == 0}
    assert [rid for rid, beside in engine.added if beside & step0_ids] == ["1", "2", "3"]  # only step 0's own
    assert sorted(f.id for f in w.finished) == list(range(8))
    # step 0 alone: 2 iterations at 4 running, 7 at 1 -> 2 x 2.0 + 7 x 1.25; step 1: the same shape 3 + 6
    assert w.wall == pytest.approx(2 * 2.0 + 7 * 1.25 + 2 * 2.0 + 1 * 1.75 + 6 * 1.25)


def test_refill_admits_whole_groups_into_freed_slots_and_never_exceeds_the_batch():
    engine = FakeEngine()
    w = long_tail.drive(engine, _requests(STEPS), batch=4, mode="refill", clock=engine.clock)
    assert engine.most_running == 4
    # step 1's first group came in while step 0's long response still ran
    assert dict(engine.added)["4"] == {"1"}
    ids = [int(rid) for rid, _ in engine.added]
    assert ids == sorted(ids)  # in order, groups whole (consecutive ids)
    assert sorted(f.id for f in w.finished) == list(range(8))
    sequential = FakeEngine()
    s = long_tail.drive(sequential, _requests(STEPS), batch=4, mode="sequential", clock=sequential.clock)
    assert w.wall < s.wall  # the tail is shared with the next step's groups
    assert sum(len(f.tokens) for f in w.finished) == sum(len(f.tokens) for f in s.finished)


def test_joint_admits_every_step_at_once_as_one_call_of_several_steps_does():
    engine = FakeEngine()
    reqs = _requests(STEPS)
    w = long_tail.drive(engine, reqs, batch=len(reqs), mode="joint", clock=engine.clock)
    assert engine.most_running == 8
    assert engine.added[-1] == (str(reqs[-1].id), {str(r.id) for r in reqs[:-1]})  # all before any iteration
    sequential = FakeEngine()
    s = long_tail.drive(sequential, reqs, batch=4, mode="sequential", clock=sequential.clock)
    assert w.wall < s.wall  # one tail for both steps
    assert sorted(len(f.tokens) for f in w.finished) == sorted(len(f.tokens) for f in s.finished)


def test_idle_fraction_is_the_wall_time_the_full_batch_rate_would_not_need():
    engine = FakeEngine()
    w = long_tail.drive(engine, _requests(STEPS[:1]), batch=4, mode="sequential", clock=engine.clock)
    # full-batch iterations: the first has a prefill (admitted just before it) and is left out; the second
    # ran 4 requests in 2.0 s
    assert long_tail.peak_throughput([w]) == pytest.approx(4 / 2.0)
    s = long_tail.summarise(w, peak=2.0)
    tokens = 2 + 9 + 2 + 2
    wall = 2 * 2.0 + 7 * 1.25
    assert (s.tokens, s.wall) == (tokens, pytest.approx(wall))
    assert s.idle == pytest.approx(1 - tokens / (2.0 * wall))
    assert s.mean_running == pytest.approx((2 * 4 * 2.0 + 7 * 1 * 1.25) / wall)
    assert s.first_group == pytest.approx(4.0)  # the second group: both done at iteration 2
    assert s.last_group == pytest.approx(wall)
    assert s.wait == pytest.approx(wall - 4.0)
    assert long_tail.lengths(w)["truncated"] == 1  # the 9-token response ends by length
    occ = long_tail.occupancy(w, bins=2)
    assert sum(occ) / 2 == pytest.approx(s.mean_running)


def test_combined_windows_run_back_to_back():
    a, b = FakeEngine(), FakeEngine()
    reqs = _requests(STEPS)
    wa = long_tail.drive(a, [r for r in reqs if r.step == 0], 4, "sequential", clock=a.clock)
    wb = long_tail.drive(b, [r for r in reqs if r.step == 1], 4, "sequential", clock=b.clock)
    both = long_tail.combine([wa, wb])
    assert both.wall == pytest.approx(wa.wall + wb.wall)
    assert max(f.at for f in both.finished if f.step == 1) == pytest.approx(wa.wall + wb.wall)


def test_a_group_larger_than_the_batch_is_refused():
    with pytest.raises(ValueError, match="batch=1"):
        long_tail.drive(FakeEngine(), _requests(STEPS), batch=1, mode="refill")


def test_no_full_batch_iteration_means_no_peak():
    engine = FakeEngine()
    w = long_tail.drive(engine, _requests([[[1, 1]]]), batch=4, mode="sequential", clock=engine.clock)
    with pytest.raises(ValueError, match="full batch"):
        long_tail.peak_throughput([w])
