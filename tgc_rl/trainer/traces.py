"""Rollout traces: a bounded sample of every step's trajectories, kept in the run directory.

    <run_dir>/traces/steps-00000001.jsonl   one TraceRecord per line, steps 1..steps_per_file, in
    <run_dir>/traces/steps-00000051.jsonl   (step, group, index) order; the oldest files go beyond
                                             spec.traces.max_total_bytes

The trainer writes (`TraceWriter`, the file append off the step's path); the control plane reads pages back
(`read_page`, a line at a time with a cap per line, never a symlink). The one home of the file layout; a line is
a `tgc_rl.wire.TraceRecord`, which the control plane and the SDK import without the trainer's dependencies.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from tgc_rl.config import TracesSpec
from tgc_rl.trainer.data import derive_seed
from tgc_rl.wire import Selected, TraceRecord

log = logging.getLogger("tgc.trainer")

TRACES_DIR = "traces"
_FILE = re.compile(r"steps-(\d{8,})\.jsonl", re.ASCII)
# a record is at most spec.traces.max_step_bytes (<= 16 MiB); a longer line is not one of ours and is skipped
MAX_LINE_BYTES = (16 << 20) + (64 << 10)


# -- what the trainer hands over (loop.Group satisfies these) ------------------------------------------
class _Item(Protocol):
    @property
    def prompt(self) -> str: ...


class _Prompt(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def item(self) -> _Item: ...


class _Completion(Protocol):
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    version: int


class _Score(Protocol):
    @property
    def reward(self) -> float: ...
    @property
    def status(self) -> str: ...
    @property
    def detail(self) -> str: ...


class TracedGroup(Protocol):
    @property
    def prompt(self) -> _Prompt: ...
    @property
    def completions(self) -> Sequence[_Completion]: ...
    @property
    def scores(self) -> Sequence[_Score]: ...


def file_name(first_step: int) -> str:
    return f"steps-{first_step:08d}.jsonl"


def select(
    rewards: Sequence[Sequence[float]], spec: TracesSpec, rng: random.Random
) -> list[tuple[int, int, list[Selected]]]:
    """(group, index, why) of the trajectories to keep, most wanted first (the per-step byte bound keeps a
    prefix): every group's best and worst, then one random other per group, then whole groups."""
    tags: dict[tuple[int, int], list[Selected]] = {}

    def tag(g: int, i: int, why: Selected) -> None:
        tags.setdefault((g, i), [])
        if why not in tags[(g, i)]:
            tags[(g, i)].append(why)

    for g, rs in enumerate(rewards):
        if not rs:
            continue
        if "best" in spec.per_group:
            tag(g, max(range(len(rs)), key=lambda i: rs[i]), "best")
        if "worst" in spec.per_group:
            tag(g, min(range(len(rs)), key=lambda i: rs[i]), "worst")
    if "random" in spec.per_group:
        for g, rs in enumerate(rewards):
            others = [i for i in range(len(rs)) if (g, i) not in tags]
            if others:
                tag(g, rng.choice(others), "random")
    for g, rs in enumerate(rewards):
        if spec.everything or g < spec.full_groups:
            for i in range(len(rs)):
                tag(g, i, "all" if spec.everything else "group")
    return [(g, i, why) for (g, i), why in tags.items()]


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None


def _cut(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[:limit], True)


class TraceWriter:
    """Keeps each step's sample (`add_step`) in `<run_dir>/traces/`; a failure to write is logged, never raised:
    traces are for reading, and a full disk must not end a job that checkpoints elsewhere."""

    def __init__(self, run_dir: Path, spec: TracesSpec, seed: int = 0):
        self.dir = Path(run_dir) / TRACES_DIR
        self.spec, self.seed = spec, seed
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="traces")
        self._pending: Future[None] | None = None
        self._sizes: dict[int, int] = {}  # first step of each file -> bytes
        for first, path in trace_files(self.dir):
            try:
                self._sizes[first] = path.stat().st_size
            except OSError:
                pass

    def add_step(
        self,
        step: int,
        groups: Sequence[TracedGroup],
        advantages: Sequence[float] | None,
        decode: Callable[[list[int]], str],
    ) -> list[TraceRecord]:
        """Selects and serializes the step's sample now (a few decodes), appends it in the background; returns
        the records it keeps. `advantages`: one per response, in group order (None: not known)."""
        if not self.spec.enabled:
            return []
        rng = random.Random(derive_seed(self.seed, 0, step))
        picks = select([[s.reward for s in g.scores] for g in groups], self.spec, rng)
        starts = [0]
        for traced in groups:
            starts.append(starts[-1] + len(traced.completions))
        kept: list[tuple[tuple[int, int], bytes, TraceRecord]] = []
        budget = self.spec.max_step_bytes
        limit = self.spec.max_text_chars
        for g, i, why in picks:
            group = groups[g]
            c, s = group.completions[i], group.scores[i]
            prompt, cut_p = _cut(str(group.prompt.item.prompt), limit)
            response, cut_r = _cut(decode(c.token_ids), limit)
            adv = advantages[starts[g] + i] if advantages is not None else None
            record = TraceRecord(
                step=step,
                group=g,
                index=i,
                prompt_index=group.prompt.index,
                prompt=prompt,
                response=response,
                reward=_finite(float(s.reward)),
                advantage=_finite(float(adv)) if adv is not None else None,
                status=str(s.status),
                detail=str(s.detail)[:limit],
                length=len(c.token_ids),
                finish_reason=c.finish_reason,
                policy_version=c.version,
                selected=why,
                truncated=cut_p or cut_r,
                logprobs=[_finite(float(x)) for x in c.logprobs] if self.spec.logprobs else None,
            )
            line = record.model_dump_json(exclude_none=False).encode() + b"\n"
            if len(line) > budget:
                continue  # the per-step bound: a smaller record further down may still fit
            budget -= len(line)
            kept.append(((g, i), line, record))
        # file order is (step, group, index): what read_page's cursor relies on
        kept.sort(key=lambda kv: kv[0])
        data = b"".join(line for _, line, _ in kept)
        self.flush()  # one write in flight at most: a slow disk slows the trainer, never fills its memory
        if data:
            self._pending = self._pool.submit(self._append, step, data)
        return [record for _, _, record in kept]

    def flush(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)

    def resume(self, previous_run_dir: Path, step: int) -> None:
        """On resume from a checkpoint at `step` of `previous_run_dir`: its traces through `step` (a new attempt
        under the control plane writes a new run directory; the samples endpoint reads the current one)."""
        previous = Path(previous_run_dir) / TRACES_DIR
        if previous.resolve() != self.dir.resolve() and not trace_files(self.dir):
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                for first, path in trace_files(previous):
                    if first <= step:
                        with _open_regular(path) as src, open(self.dir / path.name, "wb") as dst:
                            shutil.copyfileobj(src, dst)
                        self._sizes[first] = (self.dir / path.name).stat().st_size
            except OSError as e:
                log.warning("traces: could not carry over %s: %s", previous, e)
        self.truncate_after(step)

    def truncate_after(self, step: int) -> None:
        """On resume: forget the steps the checkpoint does not contain (they are trained again)."""
        files = trace_files(self.dir)
        for first, path in files:
            try:
                if first > step:
                    path.unlink()
                    self._sizes.pop(first, None)
                elif first == max(f for f, _ in files if f <= step):  # the one file that may hold both
                    self._sizes[first] = _keep_through(path, step)
            except OSError as e:
                log.warning("traces: could not truncate %s after step %d: %s", path, step, e)

    def _append(self, step: int, data: bytes) -> None:
        first = (step - 1) // self.spec.steps_per_file * self.spec.steps_per_file + 1 if step > 0 else 0
        # never behind the newest file (files carried over from an attempt with another steps_per_file)
        first = max(first, max(self._sizes, default=0))
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / file_name(first), "ab") as fh:
                fh.write(data)
            self._sizes[first] = self._sizes.get(first, 0) + len(data)
            # rotation: the oldest files go until the rest fit (the current file fits alone: TracesSpec checks)
            while sum(self._sizes.values()) > self.spec.max_total_bytes and len(self._sizes) > 1:
                oldest = min(k for k in self._sizes if k != first)
                (self.dir / file_name(oldest)).unlink(missing_ok=True)
                del self._sizes[oldest]
        except Exception as e:  # whatever it is, the job goes on: traces are for reading, not for training
            log.warning("traces: step %d not written (%s); training goes on", step, e)


def _keep_through(path: Path, step: int) -> int:
    """Rewrites a file without its records after `step`; returns its new size."""
    tmp = path.with_suffix(".tmp")
    size = 0
    with _open_regular(path) as src, open(tmp, "wb") as dst:
        for line in _lines(src):
            if line is None:
                continue
            try:
                if int(json.loads(line)["step"]) > step:
                    break
            except (ValueError, KeyError, TypeError):
                continue
            dst.write(line)
            size += len(line)
    os.replace(tmp, path)
    return size


# -- reading back (the control plane) ---------------------------------------------------------------
def trace_files(traces_dir: Path) -> list[tuple[int, Path]]:
    """(first step, path) of each trace file, oldest first; symlinks and odd names are not trace files."""
    try:
        if not stat.S_ISDIR(os.lstat(traces_dir).st_mode):
            return []
        entries = list(os.scandir(traces_dir))
    except OSError:
        return []
    out = []
    for entry in entries:
        m = _FILE.fullmatch(entry.name)
        if m and entry.is_file(follow_symlinks=False):
            out.append((int(m.group(1)), Path(entry.path)))
    return sorted(out)


def _open_regular(path: Path) -> IO[bytes]:
    """Opens a regular file for reading, never through a symlink (a run directory is written by a job)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def _lines(fh: IO[bytes]) -> Iterator[bytes | None]:
    """Complete lines of at most MAX_LINE_BYTES; None for a longer one (skipped, never held whole) or a line
    cut short at the end of the file (a write under way)."""
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line
            continue
        if len(line) <= MAX_LINE_BYTES:
            yield None  # the file's last line, still being written
            return
        while line and not line.endswith(b"\n"):  # the rest of an overlong line, in bounded pieces
            line = fh.readline(MAX_LINE_BYTES + 1)
        yield None


@dataclass(frozen=True)
class TracePage:
    records: list[TraceRecord]
    more: bool  # records after the last one match too
    last_step: int | None  # the newest step with a record


def read_page(
    run_dir: Path,
    *,
    step: int | None = None,
    group: int | None = None,
    selected: Selected | None = None,
    after: tuple[int, int, int] | None = None,
    limit: int = 20,
) -> TracePage:
    """Up to `limit` records after the key `after` (step, group, index), filtered; unreadable lines skipped."""
    files = trace_files(Path(run_dir) / TRACES_DIR)
    out: list[TraceRecord] = []
    more = False
    for n, (first, path) in enumerate(files):
        end = files[n + 1][0] - 1 if n + 1 < len(files) else None  # the file's last possible step
        if (step is not None and (first > step or (end is not None and end < step))) or (
            after is not None and end is not None and end < after[0]
        ):
            continue
        for record in _records(path):
            if step is not None and record.step > step:
                break
            if (after is not None and record.key <= after) or (step is not None and record.step != step):
                continue
            if (group is not None and record.group != group) or (
                selected and selected not in record.selected
            ):
                continue
            if len(out) == limit:
                more = True
                break
            out.append(record)
        if more or (step is not None and first <= step and (end is None or step <= end)):
            break
    return TracePage(out, more, _last_step(files))


def _records(path: Path) -> Iterator[TraceRecord]:
    try:
        fh = _open_regular(path)
    except OSError:
        return
    with fh:
        for line in _lines(fh):
            if line is None:
                continue
            try:
                yield TraceRecord.model_validate_json(line)
            except ValueError:
                continue


def _last_step(files: list[tuple[int, Path]]) -> int | None:
    """The step of the newest complete record, from the tail of the newest file that has one."""
    for _, path in reversed(files):
        for window in (64 << 10, MAX_LINE_BYTES + 1):
            try:
                with _open_regular(path) as fh:
                    size = os.fstat(fh.fileno()).st_size
                    fh.seek(max(0, size - window))
                    lines = fh.read(window).split(b"\n")[
                        :-1
                    ]  # the last piece: empty, or a line being written
            except OSError:
                break
            if size > window:
                lines = lines[1:]  # the first piece may start mid-line
            for line in reversed(lines):
                try:
                    return int(json.loads(line)["step"])
                except (ValueError, KeyError, TypeError):
                    continue
            if size <= window:
                break
    return None
