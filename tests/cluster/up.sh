#!/usr/bin/env bash
# Start a real, minimal Kubernetes control plane on 127.0.0.1 for kubetrain's tests:
# etcd + kube-apiserver only (no scheduler, controller-manager or kubelet), started
# the way controller-runtime's envtest does, with bearer-token auth.
#
# Usage:  eval "$(tests/cluster/up.sh)"      # stdout carries only `export ...` lines
#         tests/cluster/down.sh [--purge]
#
# Env:
#   KUBETRAIN_STATE       state dir (default /tmp/kubetrain-cluster): etcd data, certs,
#                         logs, pid files, kubeconfig, env
#   KUBETRAIN_CACHE       where build.sh puts binaries (default $HOME/.cache/kubetrain)
#   KUBETRAIN_SKIP_BUILD=1  don't run build.sh (binaries must already be in $KUBETRAIN_CACHE/bin)
#   KUBETRAIN_TOKEN       admin bearer token (default: random per start)
#   KUBETRAIN_APISERVER_PORT / KUBETRAIN_ETCD_PORT   fixed ports (default: free ports)
#   KUBETRAIN_KEEP_DATA=1 keep the etcd data dir from a previous run (default: start empty)
#   KUBETRAIN_READY_TIMEOUT  seconds to wait for /readyz (default 120)
#   KUBETRAIN_APISERVER_EXTRA_ARGS  extra kube-apiserver flags (word-split)
#   KUBETRAIN_CONTROLLER_MANAGER=1  also build and start kube-controller-manager (Deployments ->
#                         ReplicaSets -> Pods, garbage collection, namespace deletion, the
#                         "default" ServiceAccount of each namespace, ...); default: not started
#   KUBETRAIN_CONTROLLER_MANAGER_EXTRA_ARGS  extra kube-controller-manager flags (word-split)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${KUBETRAIN_STATE:-/tmp/kubetrain-cluster}"
CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}"
BIN="$CACHE/bin"
READY_TIMEOUT="${KUBETRAIN_READY_TIMEOUT:-120}"
HOST=127.0.0.1

log() { echo "up.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for t in openssl curl; do command -v "$t" >/dev/null || die "$t is required (apt-get install $t)"; done

mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
CERTS="$STATE/certs"
LOGS="$STATE/logs"
KUBECONFIG_PATH="$STATE/kubeconfig"
ENV_FILE="$STATE/env"

print_exports() {
  # The env file holds plain `export VAR=value` lines; echo them for eval.
  cat "$ENV_FILE"
  log "cluster ready: $(grep -o 'https://[^ ]*' "$ENV_FILE" | head -1)  (logs: $LOGS; stop: $HERE/down.sh)"
}

# Liveness during start-up: only "has the process gone?". (Checking the command
# line races with the fork before exec: the child still shows the shell's.)
still_running() { # still_running PIDFILE
  local pid
  pid="$(cat "$1" 2>/dev/null)" && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

pid_alive() { # pid_alive PIDFILE BINARY
  local pf="$1" bin="$2" pid
  [ -f "$pf" ] || return 1
  pid="$(cat "$pf")"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "$bin" || return 1
}

# --- already running? -------------------------------------------------------
WANT_KCM="${KUBETRAIN_CONTROLLER_MANAGER:-0}"
kcm_ok() { [ "$WANT_KCM" != 1 ] || pid_alive "$STATE/kube-controller-manager.pid" "$BIN/kube-controller-manager"; }
if [ -f "$ENV_FILE" ] && pid_alive "$STATE/etcd.pid" "$BIN/etcd" && pid_alive "$STATE/kube-apiserver.pid" "$BIN/kube-apiserver" && kcm_ok; then
  # shellcheck disable=SC1090
  ( . "$ENV_FILE"
    curl -fsS --max-time 5 --cacert "$KUBETRAIN_CA_FILE" -H "Authorization: Bearer $KUBETRAIN_TOKEN" \
      "$KUBETRAIN_APISERVER_URL/readyz" >/dev/null ) && { log "already running in $STATE"; print_exports; exit 0; }
fi
# Stale or half-started state: stop what is ours and start over.
KUBETRAIN_STATE="$STATE" "$HERE/down.sh" --quiet || true

# --- binaries -----------------------------------------------------------------
if [ "${KUBETRAIN_SKIP_BUILD:-0}" != 1 ]; then
  if [ "$WANT_KCM" = 1 ]; then
    KUBETRAIN_BUILD_CONTROLLER_MANAGER=1 "$HERE/build.sh" --quiet
  else
    "$HERE/build.sh" --quiet
  fi
fi
for b in etcd kube-apiserver; do [ -x "$BIN/$b" ] || die "$BIN/$b missing; run $HERE/build.sh"; done
if [ "$WANT_KCM" = 1 ] && [ ! -x "$BIN/kube-controller-manager" ]; then
  die "$BIN/kube-controller-manager missing; run KUBETRAIN_BUILD_CONTROLLER_MANAGER=1 $HERE/build.sh"
fi

# --- ports --------------------------------------------------------------------
free_port() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
  else
    local p
    while :; do
      p=$(( 20000 + RANDOM % 40000 ))
      (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
  fi
}
ETCD_PORT="${KUBETRAIN_ETCD_PORT:-$(free_port)}"
ETCD_PEER_PORT="$(free_port)"
API_PORT="${KUBETRAIN_APISERVER_PORT:-$(free_port)}"
while [ "$ETCD_PEER_PORT" = "$ETCD_PORT" ]; do ETCD_PEER_PORT="$(free_port)"; done
while [ "$API_PORT" = "$ETCD_PORT" ] || [ "$API_PORT" = "$ETCD_PEER_PORT" ]; do API_PORT="$(free_port)"; done
ETCD_URL="http://$HOST:$ETCD_PORT"
API_URL="https://$HOST:$API_PORT"

# --- certificates & credentials ----------------------------------------------
rm -rf "$CERTS"; mkdir -p "$CERTS" "$LOGS"; chmod 700 "$CERTS"
(
  cd "$CERTS"
  exec 2>"$LOGS/openssl.log"
  # A throwaway CA that signs the serving cert and an admin client cert.
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
    -subj "/CN=kubetrain-test-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  # Serving cert for 127.0.0.1 / localhost.
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" \
    "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" > apiserver.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile apiserver.ext -out apiserver.crt
  # Admin client cert (user admin, group system:masters) for clients preferring mTLS.
  openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin"
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth" > admin.ext
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile admin.ext -out admin.crt
  # Service-account token signing key pair.
  openssl genrsa -out sa-signer.key 2048
  openssl rsa -in sa-signer.key -pubout -out sa-signer.pub
  rm -f ./*.csr ./*.ext ./*.srl
) || die "openssl failed; see $LOGS/openssl.log"

TOKEN="${KUBETRAIN_TOKEN:-$(openssl rand -hex 24)}"
printf '%s,admin,admin,system:masters\n' "$TOKEN" > "$STATE/tokens.csv"
chmod 600 "$STATE/tokens.csv"

# --- etcd -----------------------------------------------------------------------
[ "${KUBETRAIN_KEEP_DATA:-0}" = 1 ] || rm -rf "$STATE/etcd"
mkdir -p "$STATE/etcd"; chmod 700 "$STATE/etcd"
start_bg() { # start_bg NAME PIDFILE LOGFILE CMD...
  local name="$1" pf="$2" lf="$3"; shift 3
  if command -v setsid >/dev/null; then
    setsid "$@" </dev/null >"$lf" 2>&1 &
  else
    nohup "$@" </dev/null >"$lf" 2>&1 &
  fi
  echo $! > "$pf"
  log "started $name (pid $!, log $lf)"
}
start_bg etcd "$STATE/etcd.pid" "$LOGS/etcd.log" \
  "$BIN/etcd" \
  --name=kubetrain \
  --data-dir="$STATE/etcd" \
  --listen-client-urls="$ETCD_URL" \
  --advertise-client-urls="$ETCD_URL" \
  --listen-peer-urls="http://$HOST:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="http://$HOST:$ETCD_PEER_PORT" \
  --initial-cluster="kubetrain=http://$HOST:$ETCD_PEER_PORT" \
  --unsafe-no-fsync=true \
  --log-level=warn

fail_with_log() { # fail_with_log NAME MSG
  log "---- last lines of $LOGS/$1.log ----"; tail -n 40 "$LOGS/$1.log" >&2 || true
  KUBETRAIN_STATE="$STATE" "$HERE/down.sh" --quiet || true
  die "$2"
}

deadline=$(( SECONDS + 30 ))
until curl -fsS --max-time 2 "$ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"'; do
  still_running "$STATE/etcd.pid" || fail_with_log etcd "etcd exited during startup"
  [ $SECONDS -lt $deadline ] || fail_with_log etcd "etcd not healthy after 30s"
  sleep 0.2
done
log "etcd healthy at $ETCD_URL"

# --- kube-apiserver (envtest's defaultArgs + token auth) -------------------------
# --endpoint-reconciler-type=none: the default (lease) reconciler tries every 10s to
# write Endpoints "kubernetes" = [127.0.0.1] and is rejected ("may not be in the
# loopback range"), filling the log; the Service default/kubernetes is still created.
# shellcheck disable=SC2206
EXTRA=( ${KUBETRAIN_APISERVER_EXTRA_ARGS:-} )
start_bg kube-apiserver "$STATE/kube-apiserver.pid" "$LOGS/kube-apiserver.log" \
  "$BIN/kube-apiserver" \
  --etcd-servers="$ETCD_URL" \
  --bind-address="$HOST" \
  --advertise-address="$HOST" \
  --secure-port="$API_PORT" \
  --cert-dir="$CERTS" \
  --tls-cert-file="$CERTS/apiserver.crt" \
  --tls-private-key-file="$CERTS/apiserver.key" \
  --client-ca-file="$CERTS/ca.crt" \
  --token-auth-file="$STATE/tokens.csv" \
  --authorization-mode=RBAC \
  --service-account-issuer="$API_URL/" \
  --service-account-key-file="$CERTS/sa-signer.pub" \
  --service-account-signing-key-file="$CERTS/sa-signer.key" \
  --service-cluster-ip-range=10.0.0.0/24 \
  --allow-privileged=true \
  --disable-admission-plugins=ServiceAccount \
  --endpoint-reconciler-type=none \
  "${EXTRA[@]}"

deadline=$(( SECONDS + READY_TIMEOUT ))
until curl -fsS --max-time 3 --cacert "$CERTS/ca.crt" -H "Authorization: Bearer $TOKEN" "$API_URL/readyz" >/dev/null 2>&1; do
  still_running "$STATE/kube-apiserver.pid" || fail_with_log kube-apiserver "kube-apiserver exited during startup"
  [ $SECONDS -lt $deadline ] || fail_with_log kube-apiserver "kube-apiserver not ready after ${READY_TIMEOUT}s"
  sleep 0.5
done
log "kube-apiserver ready at $API_URL"

# --- kubeconfig & env file ---------------------------------------------------------
CA_B64="$(base64 -w0 < "$CERTS/ca.crt")"
umask 077
cat > "$KUBECONFIG_PATH" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kubetrain
  cluster:
    server: $API_URL
    certificate-authority-data: $CA_B64
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: kubetrain
  context:
    cluster: kubetrain
    user: admin
    namespace: default
current-context: kubetrain
EOF
cat > "$ENV_FILE" <<EOF
export KUBECONFIG=$KUBECONFIG_PATH
export KUBETRAIN_APISERVER_URL=$API_URL
export KUBETRAIN_TOKEN=$TOKEN
export KUBETRAIN_CA_FILE=$CERTS/ca.crt
export KUBETRAIN_CLIENT_CERT_FILE=$CERTS/admin.crt
export KUBETRAIN_CLIENT_KEY_FILE=$CERTS/admin.key
export KUBETRAIN_ETCD_URL=$ETCD_URL
export KUBETRAIN_STATE=$STATE
export KUBETRAIN_BIN=$BIN
EOF

# --- kube-controller-manager (opt-in) -------------------------------------------------
# Runs every controller that needs no cloud provider and no kubelet: deployment, replicaset,
# garbage collector, namespace, serviceaccount (+ token), job, statefulset, daemonset, ...
# Left out: node-ipam (no pod CIDRs here), node-lifecycle and the taint-eviction ones (the
# test node agent posts Node status but no Lease; they must never evict its pods).
if [ "$WANT_KCM" = 1 ]; then
  KCM_PORT="$(free_port)"
  while [ "$KCM_PORT" = "$API_PORT" ] || [ "$KCM_PORT" = "$ETCD_PORT" ] || [ "$KCM_PORT" = "$ETCD_PEER_PORT" ]; do
    KCM_PORT="$(free_port)"
  done
  KCM_KUBECONFIG="$STATE/controller-manager.kubeconfig"
  cat > "$KCM_KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kubetrain
  cluster:
    server: $API_URL
    certificate-authority: $CERTS/ca.crt
users:
- name: kube-controller-manager
  user:
    client-certificate: $CERTS/admin.crt
    client-key: $CERTS/admin.key
contexts:
- name: kubetrain
  context:
    cluster: kubetrain
    user: kube-controller-manager
current-context: kubetrain
EOF
  mkdir -p "$STATE/controller-manager"
  # shellcheck disable=SC2206
  KCM_EXTRA=( ${KUBETRAIN_CONTROLLER_MANAGER_EXTRA_ARGS:-} )
  start_bg kube-controller-manager "$STATE/kube-controller-manager.pid" "$LOGS/kube-controller-manager.log" \
    "$BIN/kube-controller-manager" \
    --kubeconfig="$KCM_KUBECONFIG" \
    --bind-address="$HOST" \
    --secure-port="$KCM_PORT" \
    --cert-dir="$STATE/controller-manager" \
    --service-account-private-key-file="$CERTS/sa-signer.key" \
    --root-ca-file="$CERTS/ca.crt" \
    --use-service-account-credentials=false \
    --controllers='*,-node-ipam-controller,-node-lifecycle-controller,-taint-eviction-controller,-device-taint-eviction-controller' \
    --leader-elect=false \
    --service-cluster-ip-range=10.0.0.0/24 \
    "${KCM_EXTRA[@]}"
  deadline=$(( SECONDS + READY_TIMEOUT ))
  until curl -fsSk --max-time 3 "https://$HOST:$KCM_PORT/healthz" >/dev/null 2>&1; do
    still_running "$STATE/kube-controller-manager.pid" \
      || fail_with_log kube-controller-manager "kube-controller-manager exited during startup"
    [ $SECONDS -lt $deadline ] || fail_with_log kube-controller-manager "kube-controller-manager not healthy after ${READY_TIMEOUT}s"
    sleep 0.5
  done
  log "kube-controller-manager healthy at https://$HOST:$KCM_PORT"
  echo "export KUBETRAIN_CONTROLLER_MANAGER_URL=https://$HOST:$KCM_PORT" >> "$ENV_FILE"
fi
print_exports
