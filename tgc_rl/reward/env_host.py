"""EnvHost: multi-turn environments in killable worker processes, beside the reward workers.

One worker process per trajectory slot (`python -m tgc_rl.reward.env_worker`, its own process group),
started on first use and reused: a slot's `reset` builds a new environment for a new trajectory. `call`
sends one call to each named slot, all at once, and waits for every answer; a call that has not
answered by its deadline (the trajectory's time left plus `GRACE_S`) has its worker's process group
SIGKILLed (a hung tool, CPU-bound code an asyncio timeout could not stop) and comes back `killed`; the
slot gets a fresh worker on its next call. The host lives in the reward actor (tgc_rl/reward/actor.py),
so environments run where reward workers run and hold the same grants.
"""

from __future__ import annotations

import os
import selectors
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tgc_rl.reward.pool import _Worker, _worker_env, worker_init

if TYPE_CHECKING:
    from tgc_rl.config import TaskSpec
    from tgc_rl.envs import EnvSpec

GRACE_S = 1.0  # past a trajectory's deadline before its worker is killed (the environment's own bounds first)
START_TIMEOUT_S = 120.0
_MODULE = "tgc_rl.reward.env_worker"


@dataclass(frozen=True)
class EnvCall:
    """One call for slot `slot`: `reset` (arg: the TaskItem), `step` (arg: the model turn's text) or `close`;
    `time_left`: the trajectory's seconds left, the process deadline of the call (plus GRACE_S)."""

    slot: int
    op: Literal["reset", "step", "close"]
    arg: Any
    time_left: float


@dataclass(frozen=True)
class EnvReply:
    """`ok`: value is reset's messages, step's StepResult or None (close); `bound`: (reason, detail) of a
    BoundHit; `error`: the environment raised (value: what); `killed`: the call passed its deadline."""

    kind: Literal["ok", "bound", "error", "killed"]
    value: Any
    tool_calls: int = 0


class EnvHostError(RuntimeError):
    """The environment workers cannot start (the environment or the task cannot be built)."""


def _await(waiting: dict[int, tuple[_Worker, float]]) -> dict[int, tuple[str, Any] | None]:
    """The first frame of each slot's process, or None for one that passed its deadline or died."""
    out: dict[int, tuple[str, Any] | None] = {}
    sel = selectors.DefaultSelector()
    for slot, (p, _) in waiting.items():
        sel.register(p.fd_out, selectors.EVENT_READ, slot)
    try:
        while len(out) < len(waiting):
            now = time.monotonic()
            for slot, (_, end) in waiting.items():
                if slot not in out and now >= end:
                    out[slot] = None
                    sel.unregister(waiting[slot][0].fd_out)
            if len(out) == len(waiting):
                break
            timeout = min(end for s, (_, end) in waiting.items() if s not in out) - now
            for key, _ in sel.select(max(0.0, timeout)):
                slot = key.data
                p = waiting[slot][0]
                try:
                    data = os.read(p.fd_out, 1 << 20)
                except OSError:
                    data = b""
                frames = p.frames.feed(data) if data else []
                if not data or frames:
                    out[slot] = frames[0] if frames else None
                    sel.unregister(p.fd_out)
    finally:
        sel.close()
    return out


class EnvHost:
    def __init__(self, task: TaskSpec, env: EnvSpec, seed: int, grants: frozenset[str]):
        self._init = {
            **worker_init(task, seed, grants),
            "env_name": env.name,
            "env_params": dict(env.params),
            "env_bounds": env.bounds.model_dump(),
        }
        self._env = _worker_env()
        self._procs: dict[int, _Worker] = {}
        self.kills = 0  # calls killed at their deadline, since the host started

    def _start(self, slots: list[int]) -> None:
        new = {s: _Worker(s, self._init, self._env, _MODULE) for s in slots if s not in self._procs}
        if not new:
            return
        end = time.monotonic() + START_TIMEOUT_S
        answers = _await({s: (p, end) for s, p in new.items()})
        for s, p in new.items():
            frame = answers.get(s)
            if frame is None or frame[0] != "ready":
                for q in new.values():
                    q.kill()
                why = frame[1] if frame is not None else f"no answer in {START_TIMEOUT_S:g} s or it exited"
                raise EnvHostError(f"an environment worker for env {self._init['env_name']!r} failed: {why}")
            self._procs[s] = p

    def call(self, calls: list[EnvCall]) -> list[EnvReply]:
        """Each call on its slot's worker (one call per slot), concurrently; answers in order."""
        slots = [c.slot for c in calls]
        if len(set(slots)) != len(slots):
            raise ValueError("EnvHost.call: one call per slot at a time")
        idle = {c.slot for c in calls if c.op == "close" and c.slot not in self._procs}  # nothing to close
        self._start([s for s in slots if s not in idle])
        now = time.monotonic()
        waiting: dict[int, tuple[_Worker, float]] = {}
        for c in calls:
            if c.slot in idle:
                continue
            p = self._procs[c.slot]
            try:
                p.send("call", c)
            except (
                OSError,
                TimeoutError,
            ):  # the worker died (or stopped reading) between calls: a fresh one takes the call
                self._drop(c.slot)
                self._start([c.slot])
                p = self._procs[c.slot]
                p.send("call", c)
            waiting[c.slot] = (p, now + max(0.0, c.time_left) + GRACE_S)
        answers = _await(waiting)
        replies = []
        for c in calls:
            if c.slot in idle:
                replies.append(EnvReply("ok", None))
                continue
            frame = answers.get(c.slot)
            if frame is not None and frame[0] == "result":
                replies.append(frame[1])
                continue
            died = self._procs[c.slot].proc.poll() is not None
            self._drop(c.slot)
            if died:
                replies.append(EnvReply("error", "the environment's worker process exited during the call"))
            else:
                self.kills += 1
                replies.append(
                    EnvReply(
                        "killed",
                        f"the environment did not answer within the trajectory's time left "
                        f"({c.time_left:.1f} s + {GRACE_S:g} s); its process was killed",
                    )
                )
        return replies

    def _drop(self, slot: int) -> None:
        p = self._procs.pop(slot, None)
        if p is not None:
            p.kill()

    @property
    def pids(self) -> list[int]:
        return [p.proc.pid for p in self._procs.values()]

    def close(self) -> None:
        for slot in list(self._procs):
            self._drop(slot)
