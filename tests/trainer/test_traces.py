"""Rollout traces on a synthetic step (no Ray, no model): selection, bounds, rotation, resume, reading back."""

import json
import os

import pytest

from tgc_rl.batch import Completion
from tgc_rl.config import JobSpec, SpecError, TracesSpec
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.trainer.data import Prompt
from tgc_rl.trainer.loop import Group
from tgc_rl.trainer.traces import TRACES_DIR, TraceWriter, read_page, trace_files


def _groups(rewards: list[list[float]], step: int = 1) -> list[Group]:
    out = []
    for g, rs in enumerate(rewards):
        prompt = Prompt(
            index=100 * step + g, item=TaskItem(id=f"p{g}", prompt=f"prompt {step}.{g}"), token_ids=[1]
        )
        comps = [
            Completion(
                token_ids=[g, i, 7],
                logprobs=[-0.5, -1.0, -0.25],
                finish_reason="stop" if i else "length",
                version=step - 1,
            )
            for i in range(len(rs))
        ]
        scores = [Score(r, "ok", f"detail {g}.{i}") for i, r in enumerate(rs)]
        out.append(Group(prompt, comps, scores))
    return out


def _decode(ids: list[int]) -> str:
    return "response " + " ".join(map(str, ids))


def _advantages(groups: list[Group]) -> list[float]:
    return [10.0 * g + i for g, group in enumerate(groups) for i in range(len(group.completions))]


def _written(run_dir) -> list[dict]:
    return [json.loads(ln) for _, p in trace_files(run_dir / TRACES_DIR) for ln in p.read_text().splitlines()]


def _write(tmp_path, spec: TracesSpec, steps, rewards=((0.0, 1.0, 0.5, 0.2),) * 3) -> TraceWriter:
    writer = TraceWriter(tmp_path, spec, seed=3)
    for step in steps:
        groups = _groups([list(r) for r in rewards], step)
        writer.add_step(step, groups, _advantages(groups), _decode)
    writer.flush()
    return writer


def test_each_group_gives_its_best_worst_and_one_random_and_the_first_group_gives_all(tmp_path):
    _write(tmp_path, TracesSpec(), [1])
    rows = _written(tmp_path)
    assert [(r["group"], r["index"]) for r in rows] == sorted((r["group"], r["index"]) for r in rows)
    by_group = {g: [r for r in rows if r["group"] == g] for g in range(3)}
    assert [r["index"] for r in by_group[0]] == [0, 1, 2, 3]  # full_groups: 1
    assert "group" in by_group[0][2]["selected"]
    for g in (1, 2):
        kinds = {k: r["index"] for r in by_group[g] for k in r["selected"]}
        assert len(by_group[g]) == 3 and kinds["best"] == 1 and kinds["worst"] == 0
        assert kinds["random"] in (2, 3)
    r = next(r for r in rows if (r["group"], r["index"]) == (2, 1))
    assert r == {
        "step": 1,
        "group": 2,
        "index": 1,
        "prompt_index": 102,
        "prompt": "prompt 1.2",
        "response": "response 2 1 7",
        "reward": 1.0,
        "advantage": 21.0,
        "status": "ok",
        "detail": "detail 2.1",
        "length": 3,
        "finish_reason": "stop",
        "policy_version": 0,
        "selected": ["best"],
        "truncated": False,
        "logprobs": None,
    }


def test_logprobs_only_on_request_and_everything_only_when_asked(tmp_path):
    _write(tmp_path / "a", TracesSpec(logprobs=True, everything=True), [1])
    rows = _written(tmp_path / "a")
    assert len(rows) == 12 and all("all" in r["selected"] for r in rows)
    assert rows[0]["logprobs"] == [-0.5, -1.0, -0.25]
    _write(tmp_path / "b", TracesSpec(per_group=[], full_groups=0), [1])
    assert _written(tmp_path / "b") == []
    _write(tmp_path / "c", TracesSpec(enabled=False), [1])
    assert not (tmp_path / "c" / TRACES_DIR).exists()


def test_the_per_step_bound_keeps_the_most_wanted_records_and_cuts_long_text(tmp_path):
    spec = TracesSpec(max_step_bytes=4096, max_text_chars=64)
    writer = TraceWriter(tmp_path, spec)
    groups = _groups([[0.0, 1.0, 0.5, 0.2]] * 40)
    groups[0].prompt = Prompt(0, TaskItem(id="long", prompt="x" * 10_000), [1])
    kept = len(writer.add_step(1, groups, _advantages(groups), _decode))
    writer.close()
    rows = _written(tmp_path)
    assert len(rows) == kept and 0 < kept < 40 * 2  # not even every best and worst fits 4 KiB
    assert sum(len(p.read_bytes()) for _, p in trace_files(tmp_path / TRACES_DIR)) <= 4096
    assert all(set(r["selected"]) & {"best", "worst"} for r in rows)  # best and worst come before the rest
    first = next(r for r in rows if r["group"] == 0)
    assert first["prompt"] == "x" * 64 and first["truncated"] is True


def test_files_rotate_every_n_steps_and_the_oldest_go_beyond_the_total_bound(tmp_path):
    spec = TracesSpec(steps_per_file=2, max_step_bytes=8192, max_total_bytes=64 << 10)
    _write(tmp_path, spec, range(1, 41))
    files = trace_files(tmp_path / TRACES_DIR)
    sizes = [p.stat().st_size for _, p in files]
    assert sum(sizes) <= 64 << 10 and len(files) < 20
    assert [first for first, _ in files] == list(
        range(41 - 2 * len(files), 41, 2)
    )  # the newest kept, in order
    steps = {r["step"] for r in _written(tmp_path)}
    assert max(steps) == 40 and min(steps) == files[0][0]


def test_resume_forgets_the_steps_after_the_checkpoint(tmp_path):
    spec = TracesSpec(steps_per_file=2)
    _write(tmp_path, spec, range(1, 6)).close()
    writer = TraceWriter(tmp_path, spec)
    writer.truncate_after(3)
    groups = _groups([[0.0, 1.0]], 4)
    writer.add_step(4, groups, None, _decode)
    writer.close()
    rows = _written(tmp_path)
    assert sorted({r["step"] for r in rows}) == [1, 2, 3, 4]
    assert [r["advantage"] for r in rows if r["step"] == 4] == [None, None]


def test_a_new_attempt_carries_over_the_previous_run_dirs_traces_through_the_checkpoint(tmp_path):
    spec = TracesSpec(steps_per_file=2)
    _write(tmp_path / "attempt-1", spec, range(1, 6)).close()
    writer = TraceWriter(tmp_path / "attempt-2", spec)
    writer.resume(tmp_path / "attempt-1", 3)
    groups = _groups([[0.0, 1.0]], 4)
    writer.add_step(4, groups, None, _decode)
    writer.close()
    assert sorted({r["step"] for r in _written(tmp_path / "attempt-2")}) == [1, 2, 3, 4]
    assert sorted({r["step"] for r in _written(tmp_path / "attempt-1")}) == [1, 2, 3, 4, 5]  # left as it was
    other = TraceWriter(tmp_path / "attempt-3", TracesSpec(steps_per_file=50))  # a spec with larger files
    other.resume(tmp_path / "attempt-1", 3)
    other.add_step(4, groups, None, _decode)
    other.close()
    assert [r.step for r in read_page(tmp_path / "attempt-3", limit=200).records] == sorted(
        r["step"] for r in _written(tmp_path / "attempt-2")
    )
    same = TraceWriter(tmp_path / "attempt-1", spec)  # `tgc train --resume`: the same run directory
    same.resume(tmp_path / "attempt-1", 2)
    assert sorted({r["step"] for r in _written(tmp_path / "attempt-1")}) == [1, 2]


def test_a_spec_whose_one_file_exceeds_the_total_bound_is_refused():
    with pytest.raises(SpecError, match="traces.*max_total_bytes"):
        JobSpec.parse({"traces": {"steps_per_file": 1000, "max_step_bytes": 1 << 20}})
    assert JobSpec.parse({}).traces.enabled  # on by default, with small bounds


def test_pages_follow_the_cursor_filter_and_skip_what_is_not_a_record(tmp_path):
    spec = TracesSpec(steps_per_file=2)
    _write(tmp_path, spec, range(1, 6))
    every = _written(tmp_path)
    seen, after = [], None
    while True:
        page = read_page(tmp_path, after=after, limit=4)
        seen += page.records
        assert page.last_step == 5
        if not page.more:
            break
        after = page.records[-1].key
    assert [r.model_dump() for r in seen] == every
    step3 = read_page(tmp_path, step=3, limit=100).records
    assert {r.step for r in step3} == {3} and len(step3) == len([r for r in every if r["step"] == 3])
    worst = read_page(tmp_path, step=4, selected="worst", limit=100).records
    assert [(r.group, r.index) for r in worst] == [(0, 0), (1, 0), (2, 0)]
    assert {r.group for r in read_page(tmp_path, group=1, limit=100).records} == {1}
    # an overlong line, a torn last line, a symlink to another file: skipped, never read whole or followed
    traces = tmp_path / TRACES_DIR
    with open(traces / "steps-00000005.jsonl", "ab") as fh:
        fh.write(b"x" * (17 << 20) + b"\n" + b'{"step": 5, "gro')
    outside = tmp_path / "secret.jsonl"
    outside.write_text(json.dumps({**every[0], "step": 9, "prompt": "secret"}) + "\n")
    os.symlink(outside, traces / "steps-00000009.jsonl")
    after5 = read_page(tmp_path, step=5, limit=100)
    assert [r.model_dump() for r in after5.records] == [r for r in every if r["step"] == 5]
    assert read_page(tmp_path, step=9).records == []
    assert read_page(tmp_path / "nowhere").records == []


def test_a_hundred_steps_of_a_default_job_stay_within_the_default_bounds(tmp_path):
    spec = JobSpec.parse({}).traces  # 8 groups of 8, long responses: what a default job's steps look like
    writer = TraceWriter(tmp_path, spec)
    rewards = [[float((g + i) % 3) for i in range(8)] for g in range(8)]
    for step in range(1, 101):
        groups = _groups(rewards, step)
        writer.add_step(step, groups, _advantages(groups), lambda ids: "y" * 6000)
    writer.close()
    rows = _written(tmp_path)
    per_step = [sum(len(json.dumps(r)) for r in rows if r["step"] == s) for s in range(1, 101)]
    total = sum(p.stat().st_size for _, p in trace_files(tmp_path / TRACES_DIR))
    assert max(per_step) <= spec.max_step_bytes and total <= spec.max_total_bytes
    assert len(rows) == 100 * (8 + 7 * 3)  # nothing dropped: 29 records of ~4 KiB fit a step's 256 KiB


def test_a_failed_write_is_logged_and_the_step_goes_on(tmp_path, caplog):
    (tmp_path / TRACES_DIR).write_text("not a directory")
    writer = TraceWriter(tmp_path, TracesSpec())
    groups = _groups([[0.0, 1.0]])
    assert len(writer.add_step(1, groups, None, _decode)) == 2
    writer.close()
    assert "step 1 not written" in caplog.text
