"""RewardPool: long-lived verifier worker processes with a hard per-sample deadline.

Each worker is a process of its own (`tgc_rl/reward/worker.py`) in its own process group. One
dispatcher thread owns them: it hands queued samples to idle workers, reads results, and when a
sample passes its deadline it SIGKILLs that worker's process group, marks the sample `timeout` and
starts a replacement; a worker that dies mid-sample marks it `error`. No sample is ever a silent 0:
every one comes back with status ok, timeout or error, and each outcome is counted (Prometheus and
`stats()`). Workers are started by the dispatcher thread only, so their parent-death signal is tied
to a thread that lives as long as the pool.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgc_rl.config import TaskSpec
from tgc_rl.reward import metrics, wire
from tgc_rl.tasks.base import Score, TaskItem
from tgc_rl.tasks.grants import LOCAL_GRANTS

log = logging.getLogger(__name__)

_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
_MAX_RESTART_FAILURES = 3  # consecutive replacement workers failing to start: the pool is broken
_WRITE_TIMEOUT_S = 10.0


class RewardPoolError(RuntimeError):
    """The pool cannot verify: its workers fail to start, or it was closed."""


@dataclass
class _Request:
    id: int
    item: TaskItem
    response: str
    future: Future
    dispatched: float = 0.0


class _Worker:
    """One worker process, as the dispatcher sees it."""

    def __init__(
        self, index: int, init: dict[str, Any], env: dict[str, str], module: str = "tgc_rl.reward.worker"
    ):
        self.index = index
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None  # both are PIPEs
        self.fd_out = self.proc.stdout.fileno()
        self.fd_in = self.proc.stdin.fileno()
        fcntl.fcntl(self.fd_in, fcntl.F_SETFL, fcntl.fcntl(self.fd_in, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.frames = wire.FrameBuffer()
        self.state = "starting"  # starting -> idle <-> busy -> dead
        self.started = time.monotonic()
        self.request: _Request | None = None
        self.deadline = float("inf")
        self.send("init", init)

    def send(self, kind: str, payload: Any) -> None:
        """Write a whole frame; a worker that stops reading for `_WRITE_TIMEOUT_S` raises TimeoutError."""
        view = memoryview(wire.encode(kind, payload))
        end = time.monotonic() + _WRITE_TIMEOUT_S
        while view:
            try:
                view = view[os.write(self.fd_in, view) :]
            except BlockingIOError:
                if not select.select([], [self.fd_in], [], max(0.0, end - time.monotonic()))[1]:
                    raise TimeoutError(f"reward worker {self.proc.pid} stopped reading its input") from None

    def kill(self) -> None:
        self.state = "dead"
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def exit_reason(self) -> str:
        code = self.proc.wait()
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"


class RewardPool:
    """Verifies (item, response) pairs in killable worker processes; usable without Ray.

    `RewardPool(task_spec, seed)` starts `task.reward_workers` workers, each building the task with
    `load_task(task.name, task.params, seed, grants)`, and waits until they are ready (or raises with the
    worker's error). `score(items, responses)` returns one Score per pair, in order.
    """

    def __init__(
        self,
        task: TaskSpec,
        seed: int = 0,
        *,
        max_pending: int = 10_000,
        start_timeout_s: float = 180.0,
        grants: frozenset[str] = LOCAL_GRANTS,
    ):
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending}: must be >= 1")
        self.task = task
        self.timeout_s = float(task.reward_timeout_s)
        self.start_timeout_s = start_timeout_s
        self._label = task.name
        self._init = worker_init(task, seed, grants)
        self._env = _worker_env()
        self._stats = metrics.StatsWindow()
        self._slots = threading.BoundedSemaphore(max_pending)
        self._lock = threading.Lock()
        self._queue: collections.deque[_Request] = collections.deque()
        self._workers: list[_Worker] = []
        self._next_id = 0
        self._stop = threading.Event()
        self._broken: str | None = None
        self._restart_failures = 0
        self._ready = threading.Event()
        self._wake = _Wakeup()
        self._thread = threading.Thread(target=self._run, name=f"reward-pool-{task.name}", daemon=True)
        self._thread.start()
        # Also at interpreter exit: stop the dispatcher, which kills the workers.
        self._finalizer = weakref.finalize(self, RewardPool._shutdown, self._thread, self._wake, self._stop)
        if not self._ready.wait(start_timeout_s + 5):
            self.close()
            raise RewardPoolError(
                f"reward workers for task {task.name!r} did not start in {start_timeout_s:g}s"
            )
        if self._broken is not None:
            message = self._broken
            self.close()
            raise RewardPoolError(f"reward workers for task {task.name!r} failed to start: {message}")

    # -- public API -------------------------------------------------------------------------------------
    def submit(self, item: TaskItem, response: str) -> Future:
        """Queue one verification; blocks while `max_pending` are in flight (back-pressure)."""
        if not isinstance(response, str):
            raise TypeError(f"response must be a str, got {type(response).__name__}")
        self._slots.acquire()
        with self._lock:
            if self._stop.is_set() or self._broken is not None:
                self._slots.release()
                raise RewardPoolError(self._broken or "the reward pool is closed")
            future: Future = Future()
            future.add_done_callback(lambda _: self._slots.release())
            self._next_id += 1
            self._queue.append(_Request(self._next_id, item, response, future))
            metrics.QUEUE_DEPTH.labels(self._label).set(len(self._queue))
        self._wake.set()
        return future

    def score(self, items: list[TaskItem], responses: list[str]) -> list[Score]:
        """One Score per (item, response), same order; status ok, timeout or error, never a silent 0."""
        if len(items) != len(responses):
            raise ValueError(
                f"score(items, responses): got {len(items)} items and {len(responses)} "
                "responses; pass exactly one response per item"
            )
        futures = [self.submit(item, response) for item, response in zip(items, responses, strict=True)]
        return [f.result() for f in futures]

    def stats(self) -> dict[str, float]:
        """Step metrics: since-last-call counts (`reward/timeouts`), cumulative ones (`..._total`),
        latency quantiles, queue depth and live workers."""
        out = self._stats.read()
        with self._lock:
            out["reward/queue_depth"] = float(len(self._queue))
            out["reward/workers_alive"] = float(sum(w.state in ("idle", "busy") for w in self._workers))
        return out

    def close(self) -> None:
        """Stop every worker (no process is left behind) and fail whatever is still queued."""
        self._finalizer()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def worker_pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._workers if w.state != "dead"]

    # -- dispatcher thread ------------------------------------------------------------------------------
    @staticmethod
    def _shutdown(thread: threading.Thread, wake: _Wakeup, stop: threading.Event) -> None:
        stop.set()
        wake.set()
        if thread is not threading.current_thread():
            thread.join()
        wake.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake.fd, selectors.EVENT_READ, None)
        try:
            for i in range(self.task.reward_workers):
                self._spawn(sel, i)
            while not self._stop.is_set():
                self._dispatch()
                timeout = self._next_timeout()
                for key, _ in sel.select(timeout):
                    if key.data is None:
                        self._wake.clear()
                    else:
                        self._on_readable(sel, key.data)
                self._enforce_deadlines(sel)
        except Exception as e:  # never leave callers waiting on a dead dispatcher
            log.exception("reward pool dispatcher failed")
            with self._lock:
                self._broken = f"dispatcher failed: {type(e).__name__}: {e}"
        finally:
            self._teardown(sel)

    def _spawn(self, sel: selectors.BaseSelector, index: int) -> None:
        worker = _Worker(index, self._init, self._env)
        sel.register(worker.fd_out, selectors.EVENT_READ, worker)
        with self._lock:
            self._workers = [w for w in self._workers if w.index != index] + [worker]

    def _replace(self, sel: selectors.BaseSelector, worker: _Worker) -> None:
        try:
            sel.unregister(worker.fd_out)
        except (KeyError, ValueError):
            pass
        if worker.state != "dead":
            worker.kill()
        self._stats.restarted()
        metrics.WORKER_RESTARTS.labels(self._label).inc()
        if not self._stop.is_set() and self._broken is None:
            self._spawn(sel, worker.index)

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                idle = next((w for w in self._workers if w.state == "idle"), None)
                if idle is None or not self._queue:
                    metrics.QUEUE_DEPTH.labels(self._label).set(len(self._queue))
                    return
                req = self._queue.popleft()
            if req.future.cancelled():
                continue
            req.dispatched = time.monotonic()
            idle.state, idle.request, idle.deadline = "busy", req, req.dispatched + self.timeout_s
            try:
                idle.send("score", (req.id, req.item, req.response))
            except (OSError, TimeoutError, ValueError) as e:
                idle.state = "broken-pipe"  # reaped in _enforce_deadlines via its EOF or deadline
                if isinstance(e, ValueError):  # the request itself cannot be framed
                    idle.state, idle.request, idle.deadline = "idle", None, float("inf")
                    self._finish(req, Score(0.0, "error", str(e)))

    def _next_timeout(self) -> float:
        now = time.monotonic()
        with self._lock:
            ends = [w.deadline for w in self._workers if w.request is not None]
            ends += [w.started + self.start_timeout_s for w in self._workers if w.state == "starting"]
        return max(0.0, min([now + 1.0, *ends]) - now)

    def _on_readable(self, sel: selectors.BaseSelector, worker: _Worker) -> None:
        try:
            data = os.read(worker.fd_out, 1 << 20)
        except OSError:
            data = b""
        if not data:
            self._on_exit(sel, worker)
            return
        for kind, payload in worker.frames.feed(data):
            if kind == "ready":
                worker.state = "idle"
                self._restart_failures = 0
                self._check_ready()
            elif kind == "init_error":
                self._on_init_error(sel, worker, payload)
                return
            elif kind == "result":
                req_id, score, _ = payload
                req = worker.request
                if req is not None and req.id == req_id:
                    worker.state, worker.request, worker.deadline = "idle", None, float("inf")
                    self._finish(req, score)

    def _on_exit(self, sel: selectors.BaseSelector, worker: _Worker) -> None:
        was = worker.state
        worker.kill()
        reason = worker.exit_reason()
        req, worker.request = worker.request, None
        # Account for the replacement before the caller sees the sample's result.
        if was == "starting":
            self._on_init_error(sel, worker, f"a worker {reason} before it was ready")
        else:
            self._replace(sel, worker)
        if req is not None:
            self._finish(req, Score(0.0, "error", f"reward worker {reason} while verifying this sample"))

    def _on_init_error(self, sel: selectors.BaseSelector, worker: _Worker, message: str) -> None:
        if worker.state != "dead":
            worker.kill()
        try:
            sel.unregister(worker.fd_out)
        except (KeyError, ValueError):
            pass
        self._restart_failures += 1
        if not self._ready.is_set() or self._restart_failures >= _MAX_RESTART_FAILURES:
            self._fail_all(message)
            return
        self._replace(sel, worker)

    def _enforce_deadlines(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        with self._lock:
            workers = list(self._workers)
        for w in workers:
            if w.request is not None and now >= w.deadline:
                req, w.request = w.request, None
                w.kill()
                self._replace(sel, w)
                self._finish(
                    req,
                    Score(
                        0.0,
                        "timeout",
                        f"verification exceeded the {self.timeout_s:g}s "
                        "deadline; its worker was killed and replaced",
                    ),
                )
            elif w.state == "starting" and now >= w.started + self.start_timeout_s:
                self._on_init_error(sel, w, f"a worker did not become ready in {self.start_timeout_s:g}s")

    def _check_ready(self) -> None:
        with self._lock:
            if all(w.state in ("idle", "busy") for w in self._workers):
                self._ready.set()

    def _fail_all(self, message: str) -> None:
        with self._lock:
            self._broken = message
            queued, self._queue = list(self._queue), collections.deque()
            workers = list(self._workers)
        for w in workers:
            if w.request is not None:
                self._finish(w.request, Score(0.0, "error", f"reward pool broken: {message}"))
                w.request = None
        for req in queued:
            self._finish(req, Score(0.0, "error", f"reward pool broken: {message}"))
        self._ready.set()

    def _finish(self, req: _Request, score: Score) -> None:
        elapsed = time.monotonic() - req.dispatched if req.dispatched else 0.0
        self._stats.record(score.status, elapsed)
        metrics.VERIFICATIONS.labels(self._label, score.status).inc()
        metrics.VERIFY_SECONDS.labels(self._label).observe(elapsed)
        if not req.future.done():
            req.future.set_result(score)

    def _teardown(self, sel: selectors.BaseSelector) -> None:
        self._stop.set()
        with self._lock:
            workers, self._workers = list(self._workers), []
            queued, self._queue = list(self._queue), collections.deque()
        for w in workers:
            if w.request is not None:
                self._finish(w.request, Score(0.0, "error", "the reward pool was closed during verification"))
            w.kill()
        for req in queued:
            self._finish(req, Score(0.0, "error", "the reward pool was closed before verification"))
        metrics.QUEUE_DEPTH.labels(self._label).set(0)
        sel.close()
        self._ready.set()


class _Wakeup:
    """A self-pipe that wakes the dispatcher's select(); closing it makes later set() calls no-ops, so a
    late submitter can never write into a recycled file descriptor."""

    def __init__(self) -> None:
        self.fd, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._lock = threading.Lock()
        self._closed = False

    def set(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._w, b"x")
            except BlockingIOError:
                pass  # a wake-up is already pending

    def clear(self) -> None:
        try:
            os.read(self.fd, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.fd)
                os.close(self._w)


def worker_init(task: TaskSpec, seed: int, grants: frozenset[str]) -> dict[str, Any]:
    """What a worker builds its task verifier from (its `init` frame)."""
    return {
        "task": task.name,
        "params": task.params,  # typed (pickled as it is): the worker builds its task without parsing again
        "seed": seed,
        "reward": task.reward,
        "grants": sorted(grants),
    }


def _worker_env() -> dict[str, str]:
    """The parent's environment, with its import path (custom reward modules) and one thread per worker."""
    env = dict(os.environ)
    paths = [_PROJECT_ROOT] + [p or os.getcwd() for p in sys.path if p != _PROJECT_ROOT]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["TGC_REWARD_POOL_PID"] = str(os.getpid())
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")
    return env
