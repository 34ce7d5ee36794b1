#!/usr/bin/env bash
# Builds Kueue (sigs.k8s.io/kueue), pinned, from its Go module into a cache outside the repository, and
# copies its CRDs from the same module version next to it. Reuses what is already there. For
# bench/scale.py --against kueue: Kueue runs as a process against e2e/cluster.sh's control plane.
#
#   e2e/build-kueue.sh        # prints the directory holding `kueue` and `crds/` on its last line
#
# Env: FLOTILLA_CACHE (default ~/.cache/flotilla), KUEUE_VERSION (default v0.17.0).
# Cost here (2 cores): ~3 min with a warm Go module cache, more when the modules download first;
# ~1.8 GB of memory at its peak; an 87 MB binary. Nothing fetched lands in the repository.
set -euo pipefail

KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
CACHE=${FLOTILLA_CACHE:-$HOME/.cache/flotilla}
DIR=$CACHE/bin/kueue-$KUEUE_VERSION

log() { echo "[build-kueue] $*" >&2; }

# No -trimpath and CGO as the Go toolchain defaults: the flags of a plain `go install`, so that a Go build cache
# warmed by one is reused (-trimpath or CGO_ENABLED=0 change every package's cache key).
export GOFLAGS=-mod=mod
mkdir -p "$DIR"

if [ ! -x "$DIR/kueue" ]; then
  log "building kueue $KUEUE_VERSION into $DIR (warm Go caches: ~3 min of compiling, or about a minute to link)"
  start=$SECONDS
  # `go install` prints only what it downloads; a ticker says it is still compiling.
  ( while sleep 30; do log "  still building ($((SECONDS - start)) s)"; done ) &
  ticker=$!
  trap 'kill $ticker 2>/dev/null || true' EXIT
  GOBIN=$DIR go install \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  kill $ticker 2>/dev/null || true
  log "built in $((SECONDS - start)) s"
fi

if [ ! -f "$DIR/crds/.complete" ]; then
  # The module's version list may be refused by the proxy; a pinned version downloads.
  log "copying Kueue's CRDs from sigs.k8s.io/kueue@$KUEUE_VERSION"
  mod=$(cd "$DIR" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$DIR/crds"
  cp "$mod"/config/components/crd/bases/*.yaml "$DIR/crds/"
  chmod u+w "$DIR"/crds/*.yaml
  touch "$DIR/crds/.complete"
fi

echo "$DIR"
