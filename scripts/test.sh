#!/usr/bin/env bash
# The project's test command (README quick start): lint, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The machine kind first: the suite takes about twice as long where the CPU has no native bf16 (fp32).
.venv/bin/python -c "from tgc_rl.config import host_summary; print('machine:', host_summary())"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the packages listed in pyproject.toml [tool.mypy]
# Screenshots the browser tests take are kept here (tests/browser.py), passed or failed.
export TGC_TEST_ARTIFACTS="${TGC_TEST_ARTIFACTS:-$PWD/test-artifacts}"
# Each test file's time is written here, for tests/durations.json (the order files are handed out in).
export TGC_RECORD_DURATIONS="${TGC_RECORD_DURATIONS:-$TGC_TEST_ARTIFACTS/durations.json}"
# Two workers, a test file each at a time (module fixtures stay in one process), each pinned to its own share of the
# CPUs with all it starts (tests/conftest.py), so one worker's Ray jobs never wait on the other's threads.
# TGC_TEST_WORKERS=0 runs in one process. Files are handed out longest first (tests/scheduling.py).
.venv/bin/python -m pytest -q -n "${TGC_TEST_WORKERS:-2}" --dist loadfile --durations=40 "$@"  # no -x: one failure must not hide the others
