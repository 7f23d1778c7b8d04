"""Checkpoint directories become visible only when complete, and only the newest N are kept."""

import pytest

from tgc_rl.trainer.checkpoints import Checkpoints, read_state


def test_incomplete_checkpoint_is_invisible(tmp_path):
    ck = Checkpoints(tmp_path, keep_last=2)
    tmp = ck.staging(3)
    (tmp / "model").mkdir()
    assert ck.latest() is None  # a crash here leaves nothing that resume would pick


def test_commit_then_keep_last_n(tmp_path):
    ck = Checkpoints(tmp_path, keep_last=2)
    for step in (1, 2, 3, 10):
        ck.commit(ck.staging(step), step, {"step": step})
    assert [p.name for p in ck.complete()] == ["step_3", "step_10"]  # numeric, not lexical, order
    assert read_state(ck.latest())["step"] == 10


def test_reading_an_incomplete_checkpoint_says_so(tmp_path):
    (tmp_path / "step_4").mkdir()
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        read_state(tmp_path / "step_4")
