#!/usr/bin/env bash
# The whole test suite, from nothing: system packages, the Python environment, the
# Kubernetes binaries (built once, then cached), a throw-away local cluster for the
# e2e tests (its own state and ports, so a demo cluster is left alone), unit and
# integration tests, e2e tests, teardown.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS

# Fail at once, and say why, where the disk cannot hold what the run is about to install: a fresh
# .venv is ~7.5 GiB (PyTorch and its CUDA wheels), and a fresh clone's install took 11.2 GiB at its
# peak, wheels on their way in included. pip's own "No space left on device" names nothing.
need_gib() {  # PATH GIB WHAT
  local free_gib
  free_gib=$(( $(df -Pk "$1" | awk 'NR==2 {print $4}') / 1048576 ))
  if [ "$free_gib" -lt "$2" ]; then
    echo "[test] error: $3 needs ~$2 GiB free on the disk holding $1; it has $free_gib GiB." >&2
    echo "[test] Free space there (old clones, .venv directories, /tmp), then run this again." >&2
    exit 1
  fi
}
[ -e .venv/.installed ] || need_gib . 12 "a fresh Python environment (.venv)"
need_gib . 2 "the test cluster and its logs"

scripts/install-system-deps.sh
make -s venv
echo "[test] environment ready in $((SECONDS - t0))s"

e2e/build-binaries.sh >/dev/null
echo "[test] Kubernetes binaries ready at $((SECONDS - t0))s"
e2e/loadgen.sh >/dev/null
echo "[test] load generator (guidellm) ready at $((SECONDS - t0))s"

export FLOTILLA_STATE=$PWD/.flotilla/test-cluster
export FLOTILLA_KUBECONFIG=$PWD/.flotilla/test-kubeconfig
export FLOTILLA_PORT_BASE=${FLOTILLA_TEST_PORT_BASE:-17440}
export FLOTILLA_E2E_LOGS=$PWD/.flotilla/e2e-logs
trap 'e2e/cluster.sh down || true' EXIT
e2e/cluster.sh down >/dev/null 2>&1 || true
e2e/cluster.sh up
export KUBECONFIG=$FLOTILLA_KUBECONFIG
export PATH=$(e2e/cluster.sh bin):$PATH
echo "[test] cluster up at $((SECONDS - t0))s"

.venv/bin/python -m pytest tests e2e -p no:cacheprovider "$@"
echo "[test] done in $((SECONDS - t0))s"
