#!/usr/bin/env bash
# A real local Kubernetes control plane for Flotilla's e2e tests and demo:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK with
# fake GPU nodes. No containers, no Docker.
#
#   e2e/cluster.sh up       build (or reuse) the binaries, start everything, create nodes
#   e2e/cluster.sh down     stop exactly the processes `up` started, remove the state
#   e2e/cluster.sh status   what runs, and the nodes
#   e2e/cluster.sh nodes N  make sure N fake GPU nodes exist
#   e2e/cluster.sh stop C   stop one component (SIGTERM), e.g. kube-apiserver; `kill C` sends SIGKILL
#   e2e/cluster.sh start C  start one stopped component again, and wait until it is ready
#                           (the chaos suite takes kube-apiserver and etcd down mid-run this way)
#   e2e/cluster.sh restart-clients  restart kube-controller-manager, kube-scheduler and KWOK (after an
#                           API server outage their watches back off for up to a minute) and wait for the nodes
#
# Env (defaults):
#   FLOTILLA_STATE=.flotilla/cluster   state: certs, etcd data, logs, PID files
#   FLOTILLA_NODES=4                   fake GPU nodes
#   FLOTILLA_GPUS_PER_NODE=8
#   FLOTILLA_NODES_PER_RACK=2          topology: rack and NVLink domain labels
#   FLOTILLA_PORT_BASE=16440           apiserver=BASE+3, etcd=BASE+4/+5, kcm=BASE+6, scheduler=BASE+7, kwok=BASE+8
#   FLOTILLA_POD_CIDR=127.N.0.1/16     KWOK's pod IPs (loopback: the e2e serving engines bind them); N from the port base
#   FLOTILLA_NODE_LEASE_SECONDS=40     KWOK's node lease; longer means fewer lease renewals (bench/scale.py's
#                                      1,000 nodes), and the node lifecycle controller then waits as long
#   FLOTILLA_KWOK_POD_WORKERS=4        KWOK's pod stage workers (its podPlayStageParallelism). Each sends one
#                                      pod's status patch and waits for the answer, so this many patches are
#                                      in flight at most: on a busy API server a few workers fall behind and
#                                      pods start late (a real cluster has a kubelet per node). bench/scale.py
#                                      raises it; 4 is KWOK's own default
# The kubeconfig is written to .flotilla/kubeconfig. The API server writes an audit log of every
# write (create/update/patch/delete, Metadata level: who, which User-Agent, when, the answer's code)
# to $FLOTILLA_STATE/logs/audit.log; the chaos suite reads it to see which operator wrote what.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${FLOTILLA_STATE:-$ROOT/.flotilla/cluster}
KUBECONFIG_OUT=${FLOTILLA_KUBECONFIG:-$ROOT/.flotilla/kubeconfig}
NODES=${FLOTILLA_NODES:-4}
GPUS=${FLOTILLA_GPUS_PER_NODE:-8}
PER_RACK=${FLOTILLA_NODES_PER_RACK:-2}
BASE=${FLOTILLA_PORT_BASE:-16440}
API_PORT=$((BASE + 3)) ETCD_PORT=$((BASE + 4)) ETCD_PEER=$((BASE + 5))
KCM_PORT=$((BASE + 6)) SCHED_PORT=$((BASE + 7)) KWOK_PORT=$((BASE + 8))
LEASE=${FLOTILLA_NODE_LEASE_SECONDS:-40}
KWOK_POD_WORKERS=${FLOTILLA_KWOK_POD_WORKERS:-4}
# Pod IPs in 127.0.0.0/8: every 127.x.y.z is loopback on Linux, so the e2e tests' kubelet double
# (src/flotilla/testing/serving_pods.py) can start a serving engine at each pod's own address. One /16 per port base, so
# that clusters of different port bases on one machine do not hand out the same addresses.
POD_CIDR=${FLOTILLA_POD_CIDR:-127.$(( (BASE / 1000) % 200 + 20 )).0.1/16}
# A node is not declared unreachable (and its pods evicted) while its lease can still be renewed in time.
GRACE=$(( LEASE > 50 ? LEASE : 50 ))
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { echo "[cluster] $*" >&2; }
die() { echo "[cluster] error: $*" >&2; exit 1; }

bin_dir() { "$ROOT/e2e/build-binaries.sh" | tail -n 1; }

running() {  # component -> 0 if its PID file names a live process
  local pidfile=$STATE/run/$1.pid
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

start() {  # component args...
  local name=$1; shift
  running "$name" && { log "$name already running (pid $(cat "$STATE/run/$name.pid"))"; return; }
  "$@" >>"$STATE/logs/$name.log" 2>&1 &
  echo $! >"$STATE/run/$name.pid"
  log "started $name (pid $!), log: $STATE/logs/$name.log"
}

wait_until() {  # seconds description command...
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "$what not ready after ${secs}s (see $STATE/logs/)"
    sleep 0.5
  done
}

make_certs() {
  local pki=$STATE/pki
  [ -f "$pki/admin.token" ] && return
  mkdir -p "$pki"
  log "generating CA, serving certificate and service-account key"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=flotilla-local-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  cat >"$pki/apiserver.ext" <<EXT
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EXT
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  openssl rand -hex 24 >"$pki/admin.token"
  echo "$(cat "$pki/admin.token"),flotilla-admin,flotilla-admin,\"system:masters\"" >"$pki/tokens.csv"
  chmod 600 "$pki"/*.key "$pki/admin.token" "$pki/tokens.csv"
}

write_kubeconfig() {
  mkdir -p "$(dirname "$KUBECONFIG_OUT")"
  local ca; ca=$(base64 -w0 <"$STATE/pki/ca.crt")
  cat >"$KUBECONFIG_OUT" <<KC
apiVersion: v1
kind: Config
clusters:
- name: flotilla-local
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $ca
users:
- name: flotilla-admin
  user:
    token: $(cat "$STATE/pki/admin.token")
contexts:
- name: flotilla-local
  context: {cluster: flotilla-local, user: flotilla-admin}
current-context: flotilla-local
KC
  chmod 600 "$KUBECONFIG_OUT"
}

node_list() {  # count -> JSON List of fake GPU nodes
  python3 - "$1" "$GPUS" "$PER_RACK" <<'PY'
import json, sys
count, gpus, per_rack = (int(a) for a in sys.argv[1:4])
items = []
for i in range(count):
    name = f"gpu-node-{i:04d}"
    rack = f"rack-{i // per_rack:03d}"
    capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(gpus)}
    items.append({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "type": "kwok", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "flotilla.dev/gpu-model": "H100-80GB", "flotilla.dev/rack": rack,
                "flotilla.dev/nvlink-domain": f"nvl-{i:04d}",
            },
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    })
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
}

ensure_nodes() {
  local n=$1 kubectl=$BIN/kubectl
  log "ensuring $n fake GPU nodes ($GPUS GPUs each)"
  node_list "$n" | "$kubectl" --kubeconfig "$KUBECONFIG_OUT" apply --server-side --field-manager=flotilla-cluster -f - >/dev/null
  local end=$((SECONDS + 120))
  while :; do
    local ready
    ready=$("$kubectl" --kubeconfig "$KUBECONFIG_OUT" get nodes -l type=kwok \
      -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{.spec.taints[*].key}{"\n"}{end}' |
      grep -c '^True $' || true)
    [ "$ready" -ge "$n" ] && break
    [ $SECONDS -lt $end ] || die "only $ready of $n nodes Ready and untainted after 120s"
    sleep 1
  done
  log "$n nodes Ready"
}

write_audit_policy() {  # writes at Metadata level (no bodies); reads, node heartbeats and leases not at all
  cat >"$STATE/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  verbs: [get, list, watch]
- level: None
  namespaces: [kube-node-lease]
- level: None
  resources: [{group: "", resources: [nodes/status]}]
- level: Metadata
POLICY
}

write_kwok_config() {  # KWOK's own settings that have no flag (the flags it is started with override the rest)
  [[ $KWOK_POD_WORKERS =~ ^[1-9][0-9]*$ ]] ||
    die "FLOTILLA_KWOK_POD_WORKERS must be a positive whole number, not '$KWOK_POD_WORKERS'"
  cat >"$STATE/kwok-config.yaml" <<CONF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: $KWOK_POD_WORKERS
CONF
}

start_component() {  # name: start it with its flags; etcd and kube-apiserver are waited for
  local pki=$STATE/pki
  case $1 in
    etcd)
      start etcd "$BIN/etcd" --name flotilla --data-dir "$STATE/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
        --initial-cluster "flotilla=http://127.0.0.1:$ETCD_PEER" --quota-backend-bytes 4294967296 \
        --unsafe-no-fsync --log-level warn
      wait_until 30 etcd curl -sf "http://127.0.0.1:$ETCD_PORT/health"
      ;;
    kube-apiserver)
      start kube-apiserver "$BIN/kube-apiserver" \
        --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
        --authorization-mode RBAC \
        --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
        --service-account-issuer https://kubernetes.default.svc \
        --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=true \
        --max-requests-inflight 800 --max-mutating-requests-inflight 400 \
        --watch-cache-sizes nodes#1000 \
        --enable-priority-and-fairness=false \
        --audit-policy-file "$STATE/audit-policy.yaml" --audit-log-path "$STATE/logs/audit.log" \
        --audit-log-maxsize 200 --audit-log-maxbackup 1
      wait_until 90 kube-apiserver curl -sf --cacert "$pki/ca.crt" "https://127.0.0.1:$API_PORT/readyz"
      ;;
    kube-controller-manager)
      # Finished pods are kept (the default deletes those beyond 12,500): bench/scale.py reads their times.
      start kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig "$KUBECONFIG_OUT" --authentication-kubeconfig "$KUBECONFIG_OUT" \
        --authorization-kubeconfig "$KUBECONFIG_OUT" \
        --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
        --controllers '*,-nodeipam' \
        --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
        --use-service-account-credentials=false \
        --kube-api-qps 200 --kube-api-burst 400 --concurrent-gc-syncs 40 \
        --node-monitor-grace-period "${GRACE}s" \
        --terminated-pod-gc-threshold 100000
      ;;
    kube-scheduler)
      start kube-scheduler "$BIN/kube-scheduler" \
        --kubeconfig "$KUBECONFIG_OUT" --authentication-kubeconfig "$KUBECONFIG_OUT" \
        --authorization-kubeconfig "$KUBECONFIG_OUT" \
        --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false \
        --kube-api-qps 500 --kube-api-burst 1000
      ;;
    kwok)
      [ -f "$STATE/kwok-config.yaml" ] || write_kwok_config  # `start kwok` keeps what `up` set
      start kwok "$BIN/kwok" --kubeconfig "$KUBECONFIG_OUT" --config "$ROOT/e2e/kwok-stages.yaml" \
        --config "$STATE/kwok-config.yaml" \
        --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
        --cidr "$POD_CIDR" --node-ip 10.0.0.1 --server-address "127.0.0.1:$KWOK_PORT" \
        --node-lease-duration-seconds "$LEASE"
      ;;
    *) die "unknown component $1 (one of: ${COMPONENTS[*]})" ;;
  esac
}

up() {
  command -v openssl >/dev/null || die "openssl is needed (apt-get install openssl)"
  BIN=$(bin_dir)
  mkdir -p "$STATE/run" "$STATE/logs" "$STATE/etcd"
  make_certs
  local pki=$STATE/pki
  write_kubeconfig

  write_audit_policy
  write_kwok_config
  local c
  for c in "${COMPONENTS[@]}"; do start_component "$c"; done

  wait_until 60 "the default ServiceAccount" "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" get serviceaccount default
  ensure_nodes "$NODES"
  log "ready. export KUBECONFIG=$KUBECONFIG_OUT"
}

stop_component() {  # name [signal]: stop it and wait until it is gone (SIGKILL after 30 s)
  local name=$1 sig=${2:-TERM} pidfile=$STATE/run/$1.pid pid
  [[ " ${COMPONENTS[*]} " == *" $name "* ]] || die "unknown component $name (one of: ${COMPONENTS[*]})"
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -s "$sig" "$pid"
    local end=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $end ]; then kill -9 "$pid" 2>/dev/null || true; fi
      sleep 0.2
    done
    log "stopped $name (pid $pid, SIG$sig)"
  fi
  rm -f "$pidfile"
}

restart_clients() {  # the control plane's own clients, with fresh watches (theirs back off for up to a minute
  # after the API server was away, and the scheduler exits on a cache it finds corrupted)
  local c
  for c in kube-controller-manager kube-scheduler kwok; do stop_component "$c"; done
  # A KWOK with a new identity would wait for the old one's node leases to expire (40 s) before it renews them.
  "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" delete leases -n kube-node-lease --all >/dev/null
  for c in kube-controller-manager kube-scheduler kwok; do start_component "$c"; done
  wait_until 60 "the nodes Ready again" "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" wait --for=condition=Ready \
    nodes -l type=kwok --timeout=5s
}

down() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_component "${COMPONENTS[i]}"; done
  rm -rf "$STATE" "$KUBECONFIG_OUT"
}

status() {
  local name rc=0
  for name in "${COMPONENTS[@]}"; do
    if running "$name"; then echo "$name: running (pid $(cat "$STATE/run/$name.pid"))"; else echo "$name: stopped"; rc=1; fi
  done
  if [ $rc -eq 0 ]; then
    BIN=$(bin_dir)
    "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" get nodes -L flotilla.dev/rack \
      -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GPUS:.status.allocatable.nvidia\.com/gpu,RACK:.metadata.labels.flotilla\.dev/rack'
  fi
  return $rc
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  nodes) BIN=$(bin_dir); ensure_nodes "${2:?usage: cluster.sh nodes N}" ;;
  stop) stop_component "${2:?usage: cluster.sh stop COMPONENT}" ;;
  kill) stop_component "${2:?usage: cluster.sh kill COMPONENT}" KILL ;;
  start) BIN=$(bin_dir); start_component "${2:?usage: cluster.sh start COMPONENT}" ;;
  restart-clients) BIN=$(bin_dir); restart_clients ;;
  bin) bin_dir ;;
  *) echo "usage: $0 up|down|status|nodes N|stop C|kill C|start C|restart-clients|bin" >&2; exit 2 ;;
esac
