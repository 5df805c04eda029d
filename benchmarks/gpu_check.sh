#!/usr/bin/env bash
# The prepared GPU check: everything the CUDA path must show, in one run of under 10 minutes
# on one GPU. From the repository root, on a machine with one CUDA GPU and a Python with
# torch + CUDA:
#
#     OUT=/some/folder bash benchmarks/gpu_check.sh            # default OUT: gpu-check/
#     bash benchmarks/gpu_check.sh --only parity,sampling      # some parts (names below)
#     bash benchmarks/gpu_check.sh --dry-run                   # every part on the CPU, tiny sizes
#
# It installs what is missing (quietly, each pip call under a time limit, nothing when the
# package index cannot be reached), then runs benchmarks/gpu_check.py: parts env, pytest,
# parity, throughput, sampling, ddp, each in its own process with its own time limit,
# printing one line per part and writing OUT/<part>.json, OUT/<part>.log, OUT/summary.json
# and OUT/summary.md (tables for BENCHMARKS.md). See benchmarks/README.md.
#
# Environment: PYTHON (the interpreter; default: the first of python, python3 with torch),
# GPU_CHECK_BUDGET_S (all of it, installs included; default 540), GPU_CHECK_INSTALL_S (the
# installs' share; default 150), GPU_CHECK_INSTALL=0 (install nothing), GPU_CHECK_WHEELS (a
# folder of wheels: install from it only, for a machine without the package index).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET=${GPU_CHECK_BUDGET_S:-540}
INSTALL_S=${GPU_CHECK_INSTALL_S:-150}
LOG="$OUT/install.log"
: >"$LOG"

if [ -z "${PYTHON:-}" ]; then
  for candidate in python python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
      PYTHON=$candidate
      break
    fi
  done
fi
if [ -z "${PYTHON:-}" ]; then
  echo "gpu_check: no Python with torch found (set PYTHON=...)" >&2
  exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

has() {
  "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"
}

declare -A STATUS=()
SOURCE=""  # how pip reaches packages: the wheel folder, the index, or "offline"; found once
pip_source() {
  if [ -z "$SOURCE" ]; then
    if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
      SOURCE=wheels
    elif "$PYTHON" -c "import socket; socket.create_connection(('pypi.org', 443), timeout=5)" \
        2>/dev/null; then
      SOURCE=index
    else
      SOURCE=offline
    fi
  fi
}

# pip_install MODULE SECONDS PIP-ARGS...: install when MODULE is missing, within SECONDS and
# what is left of the install budget
pip_install() {
  local module=$1 seconds=$2
  shift 2
  if has "$module"; then
    STATUS[$module]=present
    return
  fi
  if [ "${GPU_CHECK_INSTALL:-1}" = 0 ]; then
    STATUS[$module]="missing (GPU_CHECK_INSTALL=0)"
    return
  fi
  local left=$((INSTALL_S - SECONDS))
  [ "$seconds" -gt "$left" ] && seconds=$left
  pip_source
  if [ "$SOURCE" = offline ]; then
    STATUS[$module]="missing (no package index reachable)"
    return
  elif [ "$seconds" -lt 10 ]; then
    STATUS[$module]="missing (no install time left)"
    return
  fi
  local from=()
  [ "$SOURCE" = wheels ] && from=(--no-index --find-links "$GPU_CHECK_WHEELS")
  echo "== pip install $* (limit ${seconds}s)" >>"$LOG"
  if timeout -k 5 "$seconds" "$PYTHON" -m pip install --quiet --disable-pip-version-check --retries 0 \
      --timeout 15 "${from[@]}" "$@" >>"$LOG" 2>&1 && has "$module"; then
    STATUS[$module]=installed
  else
    STATUS[$module]="missing (install failed or timed out, see install.log)"
  fi
}

DRY=0
for arg in "$@"; do [ "$arg" = --dry-run ] && DRY=1; done
# what mdlm needs for the parts (not datasets, transformers or the Hub: nothing is downloaded)
pip_install yaml 40 pyyaml
pip_install rich 30 rich
pip_install safetensors 30 safetensors
pip_install pytest 30 pytest
pip_install mambapy 30 mambapy
if [ "$DRY" = 0 ] && "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  # CUDA kernels: a prebuilt wheel when one matches this torch; a source build will not fit
  pip_install flash_attn 90 flash-attn --no-build-isolation
  pip_install mamba_ssm 60 mamba-ssm --no-build-isolation
fi

for k in "${!STATUS[@]}"; do printf '%s\t%s\n' "$k" "${STATUS[$k]}"; done |
  "$PYTHON" -c '
import json, sys
status = dict(sorted(line.rstrip("\n").split("\t", 1) for line in sys.stdin if line.strip()))
open(sys.argv[1], "w").write(json.dumps(status, indent=2))
print(f"installs ({sys.argv[2]} s): " + "; ".join(f"{k} {v}" for k, v in status.items()))
' "$OUT/install.json" "$SECONDS"

exec "$PYTHON" benchmarks/gpu_check.py --out "$OUT" --budget-s "$((BUDGET - SECONDS))" "$@"
