"""Fixtures every test folder may use."""

import os

import pytest

from tests.proc_helpers import descendants, wait_until


@pytest.fixture
def no_new_children():
    """Asserts that a test leaves no process of its own behind."""
    before = descendants(os.getpid())
    yield
    assert wait_until(lambda: not (descendants(os.getpid()) - before), timeout=10), (
        f"stray processes: {descendants(os.getpid()) - before}"
    )


@pytest.fixture(scope="session")
def make_batch():
    """Factory: make_batch(n_groups=4, group_size=4, seed=0, objective="cp_grpo", ...) -> TrainBatch."""
    from tests.batches import build_batch

    return build_batch
