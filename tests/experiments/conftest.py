import fcntl
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ci_study(tmp_path_factory) -> Path:
    """`python -m experiments ci` once for the whole session, into a temporary results directory.

    Under pytest-xdist each worker has its own session, and the modules that read the study may run on either:
    the first worker to ask runs it, in the workers' common temporary folder, and the other reuses it."""
    from experiments.__main__ import main

    shared = "PYTEST_XDIST_WORKER" in os.environ
    base = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.mktemp("study")
    out = base / "experiments-ci"
    with open(base / "experiments-ci.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while the study runs: the other worker waits, then reads it
        if not (out / "done").exists():
            assert main(["ci", "--out", str(out / "results"), "--cache", str(out / "cache")]) == 0
            (out / "done").touch()
    return out / "results"
