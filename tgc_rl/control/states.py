"""A job's lifecycle (the states: tgc_rl/run_layout.py): queued -> starting -> running -> (succeeded | failed | cancelled).

A terminal job may go back to `queued` only through a resume (a new attempt from a checkpoint).
"""

from __future__ import annotations

from tgc_rl.run_layout import JobState

__all__ = ["ACTIVE", "RESUMABLE", "TERMINAL", "JobState", "can_transition", "sources_of"]

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
