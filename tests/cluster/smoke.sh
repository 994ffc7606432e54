#!/usr/bin/env bash
# Smoke test of the real control plane: up -> kubectl/REST checks -> down.
# Uses its own state dir (default: a fresh /tmp/kubetrain-smoke.XXXXXX) so it never
# touches a cluster started with the default KUBETRAIN_STATE, and purges it at the end.
# Exits non-zero on any failure; the last line is "smoke: N passed, N failed".
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export KUBETRAIN_STATE="${KUBETRAIN_SMOKE_STATE:-$(mktemp -d /tmp/kubetrain-smoke.XXXXXX)}"
PASS=0
FAIL=0
NS=kt-smoke
TMP="$KUBETRAIN_STATE/smoke"

cleanup() {
  local rc=$?
  [ -n "${WATCH_PID:-}" ] && kill "$WATCH_PID" 2>/dev/null
  if [ "$FAIL" -ne 0 ] || [ "$rc" -ne 0 ]; then
    for f in "$KUBETRAIN_STATE"/logs/*.log; do
      [ -f "$f" ] && { echo "---- tail $f ----"; tail -n 30 "$f"; }
    done >&2
  fi
  "$HERE/down.sh" --purge --quiet
}
trap cleanup EXIT

check() { # check DESCRIPTION CMD...
  local desc="$1"; shift
  local out
  if out="$("$@" 2>&1)"; then
    PASS=$((PASS + 1)); echo "ok   - $desc"
  else
    FAIL=$((FAIL + 1)); echo "FAIL - $desc"; echo "$out" | sed 's/^/       /' | tail -n 20
  fi
}

t0=$SECONDS
if ! ENV_LINES="$("$HERE/up.sh")"; then
  echo "FAIL - up.sh"; echo "smoke: 0 passed, 1 failed"; exit 1
fi
eval "$ENV_LINES"
echo "ok   - up.sh ($((SECONDS - t0))s): $KUBETRAIN_APISERVER_URL"
PASS=$((PASS + 1))
mkdir -p "$TMP"
K="$KUBETRAIN_BIN/kubectl"
[ -x "$K" ] || { echo "FAIL - kubectl not built ($K)"; FAIL=$((FAIL + 1)); echo "smoke: $PASS passed, $FAIL failed"; exit 1; }
CURL=(curl -fsS --max-time 10 --cacert "$KUBETRAIN_CA_FILE" -H "Authorization: Bearer $KUBETRAIN_TOKEN")

# --- basics -------------------------------------------------------------------
check "kubectl version reports server v1.x" \
  bash -c "'$K' version -o json | grep -q '\"gitVersion\": \"v1\\.'"
check "/readyz via curl (token + CA)" "${CURL[@]}" "$KUBETRAIN_APISERVER_URL/readyz"
check "/version via mTLS client cert" \
  curl -fsS --max-time 10 --cacert "$KUBETRAIN_CA_FILE" --cert "$KUBETRAIN_CLIENT_CERT_FILE" \
  --key "$KUBETRAIN_CLIENT_KEY_FILE" "$KUBETRAIN_APISERVER_URL/version"
check "bad token is rejected with 401" \
  bash -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' --cacert '$KUBETRAIN_CA_FILE' -H 'Authorization: Bearer nope' '$KUBETRAIN_APISERVER_URL/api')\" = 401 ]"
check "kubectl auth can-i '*' '*' (system:masters)" "$K" auth can-i '*' '*'
check "kubectl get ns lists default, kube-system, kube-public" \
  bash -c "out=\$('$K' get ns -o name) && echo \"\$out\" && for n in default kube-system kube-public; do echo \"\$out\" | grep -qx namespace/\$n || exit 1; done"

# --- namespace + ConfigMap --------------------------------------------------------
check "create namespace $NS" "$K" create namespace "$NS"
check "create ConfigMap" "$K" -n "$NS" create configmap kt-cm --from-literal=hello=world
check "read ConfigMap back" \
  bash -c "[ \"\$('$K' -n $NS get configmap kt-cm -o jsonpath='{.data.hello}')\" = world ]"
check "server-side apply ConfigMap" bash -c "cat <<'EOF' | '$K' apply --server-side --field-manager=kt-smoke -f -
apiVersion: v1
kind: ConfigMap
metadata: {name: kt-cm2, namespace: $NS}
data: {a: '1'}
EOF"

# --- CRD ------------------------------------------------------------------------
cat > "$TMP/crd.yaml" <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
          status:
            type: object
            properties:
              ready: {type: boolean}
EOF
check "kubectl apply CRD widgets.example.com" "$K" apply -f "$TMP/crd.yaml"
check "CRD becomes Established" "$K" wait --for=condition=Established crd/widgets.example.com --timeout=60s

widget() { printf 'apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: %s, namespace: %s}\nspec: {size: %s}\n' "$1" "$NS" "$2"; }
widget w1 3 > "$TMP/w1.yaml"
widget w2 5 > "$TMP/w2.yaml"
widget w3 7 > "$TMP/w3.yaml"
# Discovery of a just-Established CRD can lag a moment in kubectl's cache; retry briefly.
check "create custom object Widget w1" \
  bash -c "for i in 1 2 3 4 5 6 7 8 9 10; do '$K' apply -f '$TMP/w1.yaml' && exit 0; sleep 1; done; exit 1"
check "read Widget w1 spec.size" \
  bash -c "[ \"\$('$K' -n $NS get widget w1 -o jsonpath='{.spec.size}')\" = 3 ]"
check "patch Widget w1 /status subresource" \
  "$K" -n "$NS" patch widget w1 --subresource=status --type=merge -p '{"status":{"ready":true}}'
check "read Widget w1 status.ready" \
  bash -c "[ \"\$('$K' -n $NS get widget w1 -o jsonpath='{.status.ready}')\" = true ]"

# --- watch ----------------------------------------------------------------------
# kubectl watch: start it, create w2 while it runs, expect to see w2.
"$K" -n "$NS" get widgets --watch --request-timeout=6s -o name > "$TMP/kwatch.out" 2>"$TMP/kwatch.err" &
WATCH_PID=$!
sleep 2
"$K" apply -f "$TMP/w2.yaml" >/dev/null 2>&1
wait "$WATCH_PID" 2>/dev/null
WATCH_PID=
check "kubectl get --watch sees Widget created during the watch" \
  bash -c "cat '$TMP/kwatch.out' '$TMP/kwatch.err'; grep -q 'widget.example.com/w2' '$TMP/kwatch.out'"

# Raw REST watch: list RV, then watch from it and create w3.
# Custom-object lists are unstructured JSON with sorted keys (apiVersion, items, kind,
# metadata), so the list's own metadata.resourceVersion is the LAST one in the body.
RV="$("${CURL[@]}" "$KUBETRAIN_APISERVER_URL/apis/example.com/v1/namespaces/$NS/widgets" | grep -o '"resourceVersion": *"[0-9]*"' | tail -n 1 | grep -o '[0-9][0-9]*')"
curl -sSN --max-time 10 --cacert "$KUBETRAIN_CA_FILE" -H "Authorization: Bearer $KUBETRAIN_TOKEN" \
  "$KUBETRAIN_APISERVER_URL/apis/example.com/v1/namespaces/$NS/widgets?watch=1&resourceVersion=$RV&allowWatchBookmarks=true&timeoutSeconds=4" \
  > "$TMP/rwatch.out" 2>"$TMP/rwatch.err" &
WATCH_PID=$!
sleep 1.5
"$K" apply -f "$TMP/w3.yaml" >/dev/null 2>&1
wait "$WATCH_PID"; rc=$?
WATCH_PID=
check "REST watch from list resourceVersion ($RV) streams only ADDED w3 and ends cleanly" \
  bash -c "cat '$TMP/rwatch.out' '$TMP/rwatch.err' | cut -c1-300; [ -n '$RV' ] && [ $rc = 0 ] &&
    grep '\"type\":\"ADDED\"' '$TMP/rwatch.out' | grep -q '\"name\":\"w3\"' &&
    ! grep '\"type\":\"ADDED\"' '$TMP/rwatch.out' | grep -q '\"name\":\"w[12]\"'"

check "list Widgets shows w1 w2 w3" \
  bash -c "[ \"\$('$K' -n $NS get widgets -o jsonpath='{.items[*].metadata.name}')\" = 'w1 w2 w3' ]"
check "delete Widget w1" "$K" -n "$NS" delete widget w1 --wait=true --timeout=20s

echo "smoke: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
