#!/usr/bin/env bash
# The project's test command (README quick start): lint, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The machine kind first: the suite takes about twice as long where the CPU has no native bf16 (fp32).
.venv/bin/python -c "from services.config import host_summary; print('machine:', host_summary())"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the packages listed in pyproject.toml [tool.mypy]
.venv/bin/python -m pytest -q --durations=25 "$@"  # no -x: one failure must not hide the others
