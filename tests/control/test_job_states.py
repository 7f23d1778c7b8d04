from tgc_rl.control.states import ACTIVE, RESUMABLE, TERMINAL, JobState, can_transition, sources_of


def test_lifecycle_runs_queued_starting_running_then_a_terminal_state():
    assert can_transition(JobState.QUEUED, JobState.STARTING)
    assert can_transition(JobState.STARTING, JobState.RUNNING)
    for end in TERMINAL:
        assert can_transition(JobState.RUNNING, end)


def test_states_cannot_go_backwards_except_resume_to_queued():
    assert not can_transition(JobState.RUNNING, JobState.STARTING)
    assert not can_transition(JobState.RUNNING, JobState.QUEUED)
    assert not can_transition(JobState.QUEUED, JobState.RUNNING)
    assert sources_of(JobState.QUEUED) == RESUMABLE


def test_succeeded_is_final():
    assert not any(can_transition(JobState.SUCCEEDED, s) for s in JobState)


def test_terminal_and_active_partition_the_non_queued_states():
    assert TERMINAL.isdisjoint(ACTIVE)
    assert set(JobState) == TERMINAL | ACTIVE | {JobState.QUEUED}
    assert all(s.terminal for s in TERMINAL) and not JobState.RUNNING.terminal
