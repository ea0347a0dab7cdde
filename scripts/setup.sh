#!/usr/bin/env bash
# Create .venv and install verl-workbench with its test tools. Idempotent; safe to re-run.
# On a machine without an NVIDIA GPU, torch is pinned to the CPU build (a plain `torch` from PyPI would pull
# several GB of CUDA wheels for nothing). On a GPU server, install verl's vLLM extra yourself or use your verl image:
#   .venv/bin/pip install -e ".[gpu]"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1 && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # this workplace keeps a CPU build of torch 2.13.0 on disk, where pip's find-links point
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[test]"
echo "verl-workbench installed in .venv ($(.venv/bin/python -c 'import verl, torch; print("verl", verl.__version__, "torch", torch.__version__)' 2>/dev/null))"
