"""A reward worker process: `python -m tgc_rl.reward.worker`, started and killed by `RewardPool`.

It reads frames from stdin and writes frames to stdout (see `wire.py`): first `init` (task spec), answered
by `ready` or `init_error`; then `score` requests, each answered by one `result`. Whatever the task or a
custom reward prints goes to stderr, never into the protocol. The worker dies with the pool: it asks
the kernel for SIGKILL when its parent goes, and it exits at EOF on stdin.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from tgc_rl.reward import wire
from tgc_rl.tasks.base import Score

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: EOF on stdin still ends the worker
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _protocol_fds() -> tuple[int, int]:
    """Move the protocol off fds 0/1 so stray prints and reads cannot corrupt it."""
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return rfd, wfd


def serve(build: Callable[[Any], Any], answer: Callable[[Any, Any], Any]) -> None:
    """The worker side of the protocol: `init` -> `build(spec)` (answered `ready`, or `init_error` with why),
    then each request -> `answer(state, payload)`, written as a `result`, until EOF or `stop`."""
    parent = int(os.environ.get("TGC_REWARD_POOL_PID", os.getppid()))
    _die_with_parent(parent)
    rfd, wfd = _protocol_fds()
    frame = wire.read_frame(rfd)
    if frame is None or frame[0] != "init":
        return
    try:
        state = build(frame[1])
    except BaseException as e:  # any failure to build is reported, not hidden behind an EOF
        wire.write_frame(wfd, "init_error", f"{type(e).__name__}: {e}")
        return
    wire.write_frame(wfd, "ready", {"pid": os.getpid()})
    while (frame := wire.read_frame(rfd)) is not None:
        kind, payload = frame
        if kind == "stop":
            return
        wire.write_frame(wfd, "result", answer(state, payload))


def _verifier(spec: dict[str, Any]) -> Any:
    from tgc_rl.reward.verifier import Verifier

    verifier = Verifier(spec["task"], spec["params"], spec["seed"], spec["reward"], frozenset(spec["grants"]))
    verifier.warm_up()
    return verifier


def _score(verifier: Any, payload: tuple[int, Any, str]) -> tuple[int, Score, float]:
    req_id, item, response = payload
    start = time.perf_counter()
    try:
        score = verifier(item, response)
    except BaseException as e:  # a failing verifier is an `error` sample; the worker keeps serving
        tb = traceback.extract_tb(e.__traceback__)[-1:]
        where = f" at {tb[0].filename}:{tb[0].lineno}" if tb else ""
        score = Score(0.0, "error", f"{type(e).__name__}: {e}{where}"[:2000])
    return req_id, score, time.perf_counter() - start


def main() -> None:
    serve(_verifier, _score)


if __name__ == "__main__":
    main()
