#!/usr/bin/env bash
# Records what a real istiod sends a Bookinfo productpage sidecar: starts etcd, kube-apiserver,
# kube-controller-manager (scripts/install-kube.sh) and Istio's istiod (scripts/install-istio.sh)
# in a network namespace of their own (loopback and two local addresses, no route out), installs
# what `istioctl manifest generate` (default profile) puts there for istiod, Istio's Bookinfo
# sample injected by `istioctl kube-inject`, its DestinationRules, the reviews v2/v3
# VirtualService and the policies of tests/fixtures/istiod-1.31/policy.yaml; plays kubelet for the
# pods (binds them, writes their status); makes the productpage sidecar's node with Istio's own
# pilot-agent; then `record-xds` asks istiod's plaintext port 15010 as that node for CDS, EDS,
# LDS and RDS, over state of the world and Delta, and writes the responses as they came; then
# istiod's /debug/endpointz, endpointShardz, push_status and registryz (OUT_DIR/debug/).
#
#   scripts/record-istiod.sh [OUT_DIR]   (default tests/fixtures/istiod-1.31/bookinfo-productpage)
#
# Needs root (unshare --net), go (first run: the installs), python3, openssl. RECORD_KEEP=1 keeps
# the work directory (logs, certificates, kubeconfig) and says where it is.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(realpath -m "${1:-$ROOT/tests/fixtures/istiod-1.31/bookinfo-productpage}")"
ISTIO_MODULE_VERSION="v0.0.0-20260827124520-eed52ebb66ad"
POLICY="$ROOT/tests/fixtures/istiod-1.31/policy.yaml"
NODE=node-1
NODE_IP=172.18.0.2
# Pod addresses by `app-version`: the recorded node is productpage-v1's.
PROXY_IP=10.244.0.11
IPS='{"productpage-v1":"10.244.0.11","details-v1":"10.244.0.12","ratings-v1":"10.244.0.13","reviews-v1":"10.244.0.14","reviews-v2":"10.244.0.15","reviews-v3":"10.244.0.16"}'

say() { echo "record-istiod: $*" >&2; }
fail() { echo "record-istiod: $*" >&2; exit 1; }

if [ -z "${RECORD_ISTIOD_INSIDE:-}" ]; then
  [ "$(id -u)" = 0 ] || fail "needs root (a network namespace of its own)"
  for c in python3 openssl unshare; do command -v "$c" >/dev/null || fail "$c is not installed"; done
  # Installs and builds need the network: before entering the namespace.
  "$ROOT/scripts/install-kube.sh"
  "$ROOT/scripts/install-istio.sh"
  (cd "$ROOT" && cargo build --quiet -p e2e-tests --bin record-xds)
  GOFLAGS= go mod download "istio.io/istio@${ISTIO_MODULE_VERSION}"
  ISTIO_SRC="$(GOFLAGS= go list -m -f '{{.Dir}}' "istio.io/istio@${ISTIO_MODULE_VERSION}")"
  exec unshare --net env RECORD_ISTIOD_INSIDE=1 ISTIO_SRC="$ISTIO_SRC" "$0" "$OUT"
fi

KUBE_BIN="$("$ROOT/scripts/install-kube.sh" --print)/bin"
ISTIO_HOME="$("$ROOT/scripts/install-istio.sh" --print)"
ISTIO_BIN="$ISTIO_HOME/bin"
RECORD_XDS="$ROOT/target/debug/record-xds"
HELPER="$ROOT/scripts/record-istiod.py"
W="$(mktemp -d /tmp/record-istiod.XXXXXX)"
PIDS=()
cleanup() {
  # Last started first (istiod before the API server before etcd), each given 10 s.
  local i p t
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    p=${PIDS[i]}
    kill "$p" 2>/dev/null || continue
    for ((t = 0; t < 50; t++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [ "${RECORD_KEEP:-0}" = 1 ]; then say "kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
started=$SECONDS

# The namespace: loopback, and the productpage pod's address on an eth0 (a veth pair whose other
# end leads nowhere), where Istio's pilot-agent finds it as it would in the pod. The node's
# address is only named (the API server advertises it), never bound.
ip link set lo up
ip link add eth0 type veth peer name node0
ip addr add "$PROXY_IP/24" dev eth0
ip link set eth0 up
ip link set node0 up

wait_for() { # wait_for SECONDS WHAT CMD...: until CMD succeeds
  local limit=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -le "$deadline" ] || fail "$what not ready after ${limit} s (RECORD_KEEP=1 keeps the logs)"
    sleep 0.2
  done
}

# --- certificates: a cluster CA, the API server's serving cert, an admin client, the SA key -----
cd "$W"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=kube-ca -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout apiserver.key -out apiserver.csr 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' "$NODE_IP" >san.ext
openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out apiserver.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=admin" -keyout admin.key -out admin.csr 2>/dev/null
openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out admin.crt 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
cat >kubeconfig <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$W/ca.crt"}
users:
- name: admin
  user: {client-certificate: "$W/admin.crt", client-key: "$W/admin.key"}
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
EOF
k() { "$KUBE_BIN/kubectl" --kubeconfig "$W/kubeconfig" "$@"; }

# --- etcd, kube-apiserver, kube-controller-manager ------------------------------------------------
"$KUBE_BIN/etcd" --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:2379 \
  --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
  >etcd.log 2>&1 &
PIDS+=($!)
"$KUBE_BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 --bind-address=127.0.0.1 \
  --advertise-address="$NODE_IP" --secure-port=6443 \
  --tls-cert-file=apiserver.crt --tls-private-key-file=apiserver.key --client-ca-file=ca.crt \
  --service-account-key-file=sa.pub --service-account-signing-key-file=sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --api-audiences=https://kubernetes.default.svc.cluster.local,istio-ca \
  --authorization-mode=Node,RBAC --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true \
  >apiserver.log 2>&1 &
PIDS+=($!)
wait_for 60 kube-apiserver k get --request-timeout=2s --raw /readyz
"$KUBE_BIN/kube-controller-manager" --kubeconfig "$W/kubeconfig" --leader-elect=false \
  --bind-address=127.0.0.1 --root-ca-file=ca.crt --service-account-private-key-file=sa.key \
  --use-service-account-credentials=false --controllers='*,-nodeipam,-nodelifecycle' \
  >controller-manager.log 2>&1 &
PIDS+=($!)
say "API server ready after $((SECONDS - started)) s"

# --- what a default Istio install puts in the API server (istiod itself runs here) --------------
"$ISTIO_BIN/istioctl" manifest generate >istio-manifest.yaml
k create --dry-run=client -o json -f istio-manifest.yaml >istio-manifest.json
python3 "$HELPER" control-plane istio-manifest.json "$W" >/dev/null
k apply --server-side -f control-plane.json >/dev/null
k wait --for condition=established --timeout=60s crd --all >/dev/null

# The node, Ready, with a locality.
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $NODE
  labels:
    kubernetes.io/hostname: $NODE
    topology.kubernetes.io/region: region-1
    topology.kubernetes.io/zone: zone-1
EOF
k patch node "$NODE" --subresource=status --type=merge -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"$NODE_IP\"}],\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\"lastHeartbeatTime\":\"$(date -u +%FT%TZ)\"}]}}" >/dev/null

# --- istiod ---------------------------------------------------------------------------------------
# The env of istiod's Deployment in that manifest, with what its pod would have.
POD_NAMESPACE=istio-system POD_NAME=istiod-0 SERVICE_ACCOUNT=istiod REVISION=default \
  PILOT_CERT_PROVIDER=istiod CLUSTER_ID=Kubernetes CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel \
  PILOT_TRACE_SAMPLING=1 PILOT_ENABLE_ANALYSIS=false PLATFORM= \
  INJECTION_WEBHOOK_CONFIG_NAME=istio-sidecar-injector ISTIOD_CUSTOM_HOST=localhost \
  "$ISTIO_BIN/pilot-discovery" discovery --kubeconfig "$W/kubeconfig" --monitoringAddr=127.0.0.1:15014 \
  --log_output_level=default:info --domain cluster.local --keepaliveMaxServerConnectionAge 30m \
  >istiod.log 2>&1 &
PIDS+=($!)
wait_for 120 istiod curl -sf http://127.0.0.1:8080/ready
say "istiod ready after $((SECONDS - started)) s"

# --- Bookinfo, injected as istioctl kube-inject injects it, and its Istio config ----------------
"$ISTIO_BIN/istioctl" kube-inject --kubeconfig "$W/kubeconfig" --injectConfigFile inject-config.yaml \
  --valuesFile inject-values.json --meshConfigFile mesh.yaml \
  -f "$ISTIO_SRC/samples/bookinfo/platform/kube/bookinfo.yaml" >bookinfo-injected.yaml
k apply -n default -f bookinfo-injected.yaml >/dev/null
k apply -n default -f "$ISTIO_SRC/samples/bookinfo/networking/destination-rule-all.yaml" >/dev/null
k apply -n default -f "$ISTIO_SRC/samples/bookinfo/networking/virtual-service-reviews-v2-v3.yaml" >/dev/null
k apply -f "$POLICY" >/dev/null
python3 "$HELPER" run-pods "$KUBE_BIN/kubectl" "$W/kubeconfig" default "$NODE" "$NODE_IP" "$IPS" 6 120 >pods.txt
say "6 pods running after $((SECONDS - started)) s"

# istiod has every endpoint (6 pods behind 4 services) and every config: then it is recorded.
endpoints_ready() {
  curl -sf http://127.0.0.1:15014/debug/endpointz >endpointz.json || return 1
  python3 - <<'PY'
import json, sys
shards = json.load(open("endpointz.json"))
# host -> namespace -> {"Shards": {cluster: [endpoint]}}
addrs = set()
for host, by_ns in shards.items():
    if host.endswith(".default.svc.cluster.local"):
        for ns in by_ns.values():
            for eps in ns.get("Shards", {}).values():
                for ep in eps:
                    addrs.update(ep.get("Addresses") or [])
sys.exit(0 if len(addrs) >= 6 else 1)
PY
}
wait_for 60 "istiod's endpoints" endpoints_ready

# --- the productpage sidecar's node, as Istio's pilot-agent makes it -------------------------------
pod="$(grep '^pod productpage-v1-' pods.txt | cut -d' ' -f2)"
k get pod -n default "$pod" -o json >productpage-pod.json
python3 "$HELPER" proxy-node "$ISTIO_BIN/pilot-agent" "$ISTIO_HOME/envoy_bootstrap_tmpl.json" \
  productpage-pod.json "$W/proxy" node.json

# --- the recording -------------------------------------------------------------------------------
mkdir -p "$OUT"
"$RECORD_XDS" --addr 127.0.0.1:15010 --node node.json --out "$OUT" | tee record.txt
cp node.json "$OUT/node.json"
# istiod's debug endpoints once the node has been served: the endpoint shards, and the last push's
# status (what its generation for that node reported), for istiod-core's to be compared with.
mkdir -p "$OUT/debug"
for path in endpointz endpointShardz push_status registryz; do
  curl -sf "http://127.0.0.1:15014/debug/$path" >"$OUT/debug/$path.json"
done
{
  echo "date: $(date -u +%FT%TZ)"
  echo "command: scripts/record-istiod.sh ${OUT#"$ROOT"/}"
  echo "istio.io/istio: ${ISTIO_MODULE_VERSION} ($("$ISTIO_BIN/pilot-discovery" version --short 2>/dev/null))"
  echo "kubernetes: $("$KUBE_BIN/kube-apiserver" --version) ($(tr -d '\n' <"$(dirname "$KUBE_BIN")/.stamp"))"
  echo "etcd: $("$KUBE_BIN/etcd" --version | head -n1)"
  echo "node: $(grep -o '"id": "[^"]*"' node.json)"
  sed 's/^/recorded: /' record.txt
  sed 's/^/workload: /' pods.txt
} >"$OUT/recorded.txt"
say "recorded into $OUT after $((SECONDS - started)) s"
