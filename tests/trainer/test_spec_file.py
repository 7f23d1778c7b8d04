"""The run directory's spec.yaml is written once: by the control plane's scheduler when it starts the job (the
trainer then leaves it as it is), by the trainer itself for a local run."""

import os

import pytest

from tgc_rl.config import JobSpec
from tgc_rl.run_layout import SPEC_FILE
from tgc_rl.tasks.grants import GRANTS_ENV, GrantError
from tgc_rl.trainer.main import run

# a spec this job's grants refuse: the trainer writes spec.yaml, then stops before it starts Ray
CUSTOM = {"task": {"name": "arithmetic", "reward": "tests.trainer.rewards:text_parity"}}


def test_the_trainer_leaves_the_schedulers_spec_file_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv(GRANTS_ENV, "")  # a control-plane job without grants
    spec = JobSpec.parse(CUSTOM)
    written = tmp_path / SPEC_FILE
    written.write_text(spec.to_yaml())
    before = os.stat(written)
    with pytest.raises(GrantError):
        run(spec, tmp_path)
    after = os.stat(written)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_local_run_writes_its_spec_file(tmp_path, monkeypatch):
    monkeypatch.setenv(GRANTS_ENV, "")
    spec = JobSpec.parse(CUSTOM)
    (tmp_path / SPEC_FILE).write_text("name: an older run's spec\n")
    with pytest.raises(GrantError):
        run(spec, tmp_path)
    assert JobSpec.from_yaml(tmp_path / SPEC_FILE) == spec
