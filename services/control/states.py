"""A job's lifecycle: queued -> starting -> running -> (succeeded | failed | cancelled).

A terminal job may go back to `queued` only through a resume (a new attempt from a checkpoint).
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"  # accepted, waiting for its tenant's quota
    STARTING = "starting"  # submitted to Ray; the trainer has not reported yet
    RUNNING = "running"  # the trainer reported that it runs
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE = frozenset({JobState.STARTING, JobState.RUNNING})
RESUMABLE = frozenset({JobState.FAILED, JobState.CANCELLED})

_NEXT: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.CANCELLED, JobState.FAILED}),
    # `starting` may jump to a terminal state: the trainer can finish (or die) before we saw it run.
    JobState.STARTING: frozenset({JobState.RUNNING}) | TERMINAL,
    JobState.RUNNING: TERMINAL,
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset({JobState.QUEUED}),
}


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in _NEXT[src]


def sources_of(dst: JobState) -> frozenset[JobState]:
    """The states from which `dst` is reachable in one transition."""
    return frozenset(s for s, nxt in _NEXT.items() if dst in nxt)
