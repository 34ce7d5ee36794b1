#!/usr/bin/env bash
# The e2e tests' load generator: guidellm (the vLLM project's benchmark tool) from PyPI, pinned, in a
# virtualenv of its own cached outside the repository: it pins click~=8.4, older than the project's venv
# has, and brings transformers, datasets and pandas (~0.5 GB). Reuses what is already there.
# (inference-perf, the Gateway API Inference Extension's tool, needs Python >= 3.12.)
#
#   e2e/loadgen.sh          # prints the guidellm executable on its last line
#
# Env: FLOTILLA_CACHE (default ~/.cache/flotilla), PYTHON (default python3)
set -euo pipefail
GUIDELLM_VERSION=${GUIDELLM_VERSION:-0.8.1}
CACHE=${FLOTILLA_CACHE:-$HOME/.cache/flotilla}
VENV=$CACHE/loadgen/guidellm-$GUIDELLM_VERSION
if [ ! -f "$VENV/.installed" ]; then
  echo "[loadgen] installing guidellm $GUIDELLM_VERSION into $VENV (cold: ~2 min)" >&2
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/pip" install -q "guidellm==$GUIDELLM_VERSION" >&2
  touch "$VENV/.installed"
fi
echo "$VENV/bin/guidellm"
