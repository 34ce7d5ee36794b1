#!/usr/bin/env bash
# Debian packages Flotilla's tests and demo use: redis-server (metrics bus), PostgreSQL
# (optional database), openssl (cluster certificates), curl, chromium and chromium-driver (the console's
# browser tests and bench/console.py drive a headless Chromium; nothing is downloaded). Go must already be
# installed (it builds the Kubernetes binaries). Installs only what is missing.
#   scripts/install-system-deps.sh          # everything the tests use
#   scripts/install-system-deps.sh --demo   # only what `make demo` uses (no PostgreSQL, no Chromium)
set -euo pipefail
demo=false; [ "${1:-}" = --demo ] && demo=true
need=()
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
command -v make >/dev/null || need+=(make)
if ! $demo; then
  command -v redis-server >/dev/null || need+=(redis-server)
  [ -x /usr/lib/postgresql/15/bin/initdb ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  command -v chromium >/dev/null || need+=(chromium)
  command -v chromedriver >/dev/null || need+=(chromium-driver)
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "[deps] installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The Debian postgresql package starts a cluster of its own; the tests start throw-away ones.
command -v go >/dev/null || { echo "[deps] error: Go is needed to build the Kubernetes binaries (https://go.dev/dl/)" >&2; exit 1; }
if $demo; then
  echo "[deps] ok: $(go version | cut -d' ' -f3), openssl $(openssl version | cut -d' ' -f2)"
else
  echo "[deps] ok: $(redis-server --version | cut -d' ' -f3), $(go version | cut -d' ' -f3), openssl $(openssl version | cut -d' ' -f2), $(chromium --version 2>/dev/null | cut -d' ' -f1-2)"
fi
