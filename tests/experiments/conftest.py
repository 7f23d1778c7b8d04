from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ci_study(tmp_path_factory) -> Path:
    """`python -m experiments ci` once for the whole session, into a temporary results directory."""
    from experiments.__main__ import main

    out = tmp_path_factory.mktemp("experiments-ci")
    assert main(["ci", "--out", str(out / "results"), "--cache", str(out / "cache")]) == 0
    return out / "results"
