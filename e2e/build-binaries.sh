#!/usr/bin/env bash
# Builds the local control plane's binaries from their Go modules, pinned to exact
# versions, into a cache outside the repository. Reuses what is already there.
#
#   e2e/build-binaries.sh            # prints the bin directory on its last line
#   e2e/build-binaries.sh crds       # the Gateway API Inference Extension's CRDs (InferencePool), pinned:
#                                    # downloads its Go module once, prints the directory of the YAML files
#
# Env: FLOTILLA_CACHE (default ~/.cache/flotilla)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
HELM_VERSION=${HELM_VERSION:-v3.19.0}
GIE_VERSION=${GIE_VERSION:-v1.6.0}

CACHE=${FLOTILLA_CACHE:-$HOME/.cache/flotilla}
BIN=$CACHE/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION
SRC=$CACHE/src
mkdir -p "$BIN" "$SRC"

log() { echo "[build-binaries] $*" >&2; }
have() { [ -x "$BIN/$1" ]; }

export GOFLAGS=-mod=mod
export CGO_ENABLED=0

build_kubernetes() {
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubectl) missing=()
  for b in "${want[@]}"; do have "$b" || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && return
  log "building ${missing[*]} $K8S_VERSION (cold: ~8 min)"
  local dir=$SRC/kubernetes-$K8S_VERSION staging=v0${K8S_VERSION#v1}
  mkdir -p "$dir"
  cd "$dir"
  if [ ! -f go.sum ]; then
    cat > go.mod <<GOMOD
module flotilla.dev/build/kubernetes

go 1.25

require k8s.io/kubernetes $K8S_VERSION
GOMOD
    cat > tools.go <<'GOTOOLS'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GOTOOLS
    # k8s.io/kubernetes replaces its staging modules with relative paths; pin each
    # to the matching published version instead.
    local upstream
    upstream=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    grep -E '^\s+k8s\.io/[A-Za-z0-9._-]+ => \./staging/' "$upstream" | awk '{print $1}' | while read -r m; do
      go mod edit -replace="$m=$m@$staging"
    done
    go mod tidy
  fi
  local major=${K8S_VERSION#v}; major=${major%%.*}
  local minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  for b in "${missing[@]}"; do
    log "  go build $b"
    go build -trimpath -ldflags "$ldflags" -o "$BIN/$b" "k8s.io/kubernetes/cmd/$b"
  done
}

build_etcd() {
  have etcd && return
  log "building etcd $ETCD_VERSION (cold: ~1 min)"
  local dir=$SRC/etcd-$ETCD_VERSION
  mkdir -p "$dir"
  cd "$dir"
  if [ ! -f go.sum ]; then
    cat > go.mod <<GOMOD
module flotilla.dev/build/etcd

go 1.25

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
    cat > tools.go <<'GOTOOLS'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GOTOOLS
    for m in go.etcd.io/etcd/api/v3 go.etcd.io/etcd/client/pkg/v3 go.etcd.io/etcd/client/v3 go.etcd.io/etcd/pkg/v3; do
      go mod edit -replace="$m=$m@$ETCD_VERSION"
    done
    go mod tidy
  fi
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
}

build_go_install() {  # name module version [ldflags]
  have "$1" && return
  log "building $1 $3"
  GOBIN=$BIN go install -trimpath -ldflags "-s -w ${4:-}" "$2@$3"
}

inference_crds() {  # the module's version list is refused here, a pinned version is not
  local dir=$CACHE/crds/gateway-api-inference-extension-$GIE_VERSION
  if [ ! -f "$dir/.complete" ]; then
    log "downloading sigs.k8s.io/gateway-api-inference-extension@$GIE_VERSION (its CRDs)"
    local mod
    mod=$(cd "$SRC" && go mod download -json "sigs.k8s.io/gateway-api-inference-extension@$GIE_VERSION" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    mkdir -p "$dir"
    cp "$mod"/config/crd/bases/*.yaml "$dir/"
    touch "$dir/.complete"
  fi
  echo "$dir"
}

if [ "${1:-}" = crds ]; then
  inference_crds
  exit 0
fi

build_etcd
inference_crds >/dev/null
build_go_install kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
build_go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
build_kubernetes
echo "$BIN"
