#!/usr/bin/env bash
# The kind path, for users with Docker and internet access: a kind cluster whose
# worker nodes advertise fake nvidia.com/gpu capacity, plus KWOK (run locally,
# built like the local control plane's) for extra fake GPU nodes; the three
# component images built and loaded into it; the Helm chart installed; then the
# same e2e suite that runs on the local control plane.
#
#   e2e/kind.sh up      create the cluster, patch GPU capacity, start KWOK,
#                       build + load the images, helm install, wait for the rollout
#   e2e/kind.sh test    run the e2e suite against it (the installed operator is
#                       scaled to 0 meanwhile: the suite runs its own operators)
#   e2e/kind.sh down    delete the cluster, stop KWOK
#
# Needs: docker, kind (https://kind.sigs.k8s.io), Go (for kwok/kubectl).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NAME=${FLOTILLA_KIND_NAME:-flotilla}
GPUS=${FLOTILLA_GPUS_PER_NODE:-8}
STATE=$ROOT/.flotilla/kind
export KUBECONFIG=${FLOTILLA_KUBECONFIG:-$ROOT/.flotilla/kind-kubeconfig}
BIN=$("$ROOT/e2e/build-binaries.sh" | tail -n 1)
RELEASE=${FLOTILLA_RELEASE:-flotilla}
RELEASE_NS=${FLOTILLA_RELEASE_NAMESPACE:-flotilla-system}
FULL=$RELEASE; [[ $RELEASE == *flotilla* ]] || FULL=$RELEASE-flotilla  # the chart's name prefix
VERSION=$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' "$ROOT/charts/flotilla/Chart.yaml")

images() {  # build each component image and load it into the kind nodes
  local dir name
  for dir in operator controller agents; do
    name=flotilla-${dir%s}  # agents/ -> flotilla-agent
    docker build -f "$ROOT/$dir/Dockerfile" -t "$name:$VERSION" "$ROOT"
    kind load docker-image --name "$NAME" "$name:$VERSION"
  done
}

install_chart() {
  "$BIN/helm" upgrade --install "$RELEASE" "$ROOT/charts/flotilla" -n "$RELEASE_NS" --create-namespace \
    --set image.pullPolicy=Never --wait --timeout 5m
  "$BIN/kubectl" -n "$RELEASE_NS" rollout status daemonset "$FULL-agent" --timeout=180s
  "$BIN/kubectl" -n "$RELEASE_NS" get deployments,daemonsets,pods,lease
}

up() {
  command -v kind >/dev/null || { echo "kind not found: https://kind.sigs.k8s.io/docs/user/quick-start/" >&2; exit 1; }
  mkdir -p "$STATE"
  kind get clusters | grep -qx "$NAME" || kind create cluster --name "$NAME" --kubeconfig "$KUBECONFIG" --config - <<KIND
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
- role: worker
- role: worker
KIND
  local i=0
  for node in $("$BIN/kubectl" get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
    "$BIN/kubectl" label "$node" --overwrite nvidia.com/gpu.present=true flotilla.dev/rack="rack-$((i / 2))" \
      flotilla.dev/nvlink-domain="nvl-kind-$i" flotilla.dev/gpu-model=fake >/dev/null
    "$BIN/kubectl" patch "$node" --subresource=status --type=merge \
      -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$GPUS\"},\"allocatable\":{\"nvidia.com/gpu\":\"$GPUS\"}}}" >/dev/null
    i=$((i + 1))
  done
  if ! { [ -f "$STATE/kwok.pid" ] && kill -0 "$(cat "$STATE/kwok.pid")" 2>/dev/null; }; then
    "$BIN/kwok" --kubeconfig "$KUBECONFIG" --config "$ROOT/e2e/kwok-stages.yaml" \
      --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
      --cidr 10.250.0.1/16 --node-ip 10.250.0.1 --server-address 127.0.0.1:0 >"$STATE/kwok.log" 2>&1 &
    echo $! >"$STATE/kwok.pid"
  fi
  "$BIN/kubectl" apply --server-side -f "$ROOT/crds"
  images
  install_chart
  echo "kind cluster $NAME ready, Flotilla installed in $RELEASE_NS: export KUBECONFIG=$KUBECONFIG"
}

suite() {
  local operator=$FULL-operator replicas
  replicas=$("$BIN/kubectl" -n "$RELEASE_NS" get deployment "$operator" -o jsonpath='{.spec.replicas}')
  "$BIN/kubectl" -n "$RELEASE_NS" scale deployment "$operator" --replicas=0
  trap '"$BIN/kubectl" -n "$RELEASE_NS" scale deployment "$operator" --replicas="$replicas"' EXIT
  PATH=$BIN:$PATH "$ROOT/.venv/bin/python" -m pytest "$ROOT/e2e"
}

down() {
  if [ -f "$STATE/kwok.pid" ]; then kill "$(cat "$STATE/kwok.pid")" 2>/dev/null || true; rm -f "$STATE/kwok.pid"; fi
  kind delete cluster --name "$NAME" --kubeconfig "$KUBECONFIG" || true
}

case "${1:-}" in
  up) up ;;
  test) suite ;;
  down) down ;;
  *) echo "usage: $0 up|test|down" >&2; exit 2 ;;
esac
