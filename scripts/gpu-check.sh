#!/usr/bin/env bash
# The one-command GPU check (benchmarks/gpu_check.py; benchmarks/README.md says how to read its report):
#   scripts/gpu-check.sh                               # on a CUDA machine, under 8 minutes on an H100
#   scripts/gpu-check.sh --device cpu --tiny           # the CPU variant the test suite runs
# Writes one JSON and one text report (default benchmarks/gpu/<device>-<date>.{json,txt}; --out PATH).
# Exit status: 0 every check held, 1 a check or a part failed, 2 bad arguments or no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's environment where it exists (developer machines, CI), else the machine's python3 (a lent GPU
# machine: its own torch and transformers; rlcore and tgc_rl travel as source). PYTHON overrides both.
if [[ -n "${PYTHON:-}" ]]; then
    py=$PYTHON
elif [[ -x .venv/bin/python ]]; then
    py=.venv/bin/python
else
    py=python3
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$py" benchmarks/gpu_check.py "$@"
