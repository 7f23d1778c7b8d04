#!/usr/bin/env bash
# The project's test command (README quick start): lint, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the packages listed in pyproject.toml [tool.mypy]
.venv/bin/python -m pytest -q --durations=15 "$@"  # no -x: one failure must not hide the others
