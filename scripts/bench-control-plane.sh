#!/usr/bin/env bash
# istiod and istiod-core side by side (BENCHMARKS.md "istiod and istiod-core side by side"): the same
# mesh of ServiceEntries served by Istio's istiod (pilot-discovery, reading them from a real
# kube-apiserver) and by `istiod-core serve` (reading the same YAML from a file), each in turn to the
# same examples/xds-load sidecars (plaintext ADS, each its own connection, ACKing like Envoy):
#   convergence: 50 services x 10 endpoints, rounds alternating an endpoint move (an EDS push) and a
#     new service (a full push); time from the change (istiod: the apply to the API server;
#     istiod-core: the file write) to every proxy having it, and that minus the 100 ms debounce;
#   memory: 1000 services x 10 endpoints: RSS once all proxies are configured, after full pushes,
#     peak; CPU seconds (utime + stime from /proc) per endpoint push and per full push.
# MESH=kube (BENCHMARKS.md "istiod and istiod-core on a Kubernetes registry"): the mesh is Kubernetes
#   Services (selector app=svcI, port http 80 -> 8080) with 10 Pods each (labels app, version; a
#   service account; Ready through the status subresource) and their EndpointSlices (written by this
#   script's apply.py, as the EndpointSlice controller would), and both planes read it from the same
#   API server (istiod-core: `serve --kubeconfig`, no --config-dir); an endpoint move replaces a pod
#   (delete, create at a new address, Ready, the slice updated), a full push is a new Service with
#   its 10 Pods. The memory part also gives each plane's RSS with the registry listed and no proxy,
#   on a cluster without and with the mesh. Default MESH=serviceentry: the ServiceEntry mesh above.
# Usage: ./scripts/bench-control-plane.sh [rounds] (default 10). As root: every process (etcd,
# kube-apiserver, istiod, istiod-core, the load client) runs on the loopback of a network namespace
# of its own, removed at the end.
# BIN=DIR: prebuilt istiod-core and xds-load (DIR/istiod-core; DIR/examples/xds-load or DIR/xds-load),
# else a release build here. PARTS="convergence memory", PLANES="istiod istiod-core",
# CLIENTS=500, MEM_ROUNDS=6 (rounds in the memory part), SETTLE=5 (seconds from ready to the RSS
# before any proxy), KEEP=1 keeps the work directory.
# Istio from scripts/install-istio.sh ($ISTIO_HOME), Kubernetes from scripts/install-kube.sh ($KUBE_HOME).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-10}"
CLIENTS="${CLIENTS:-500}"
PARTS="${PARTS:-convergence memory}"
PLANES="${PLANES:-istiod istiod-core}"
MEM_ROUNDS="${MEM_ROUNDS:-6}"
MESH="${MESH:-serviceentry}"
case "$MESH" in serviceentry | kube) ;; *) echo "MESH=serviceentry or MESH=kube" >&2; exit 2 ;; esac
ISTIO_HOME="${ISTIO_HOME:-$(./scripts/install-istio.sh --print)}"
KUBE_HOME="${KUBE_HOME:-$(./scripts/install-kube.sh --print)}"
part() { [[ " $PARTS " == *" $1 "* ]]; }
plane() { [[ " $PLANES " == *" $1 "* ]]; }

if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet -p istiod-core --bin istiod-core --example xds-load
  BIN="$PWD/target/release"
fi
CORE="$BIN/istiod-core"
LOAD="$BIN/examples/xds-load"; [ -x "$LOAD" ] || LOAD="$BIN/xds-load"
# An xds-load from before XDS_LOAD_APPLY would edit a file istiod never reads: every round would time out.
usage="$("$LOAD" 2>&1 || true)"
[[ "$usage" == *'SERVER_PID[,PID'* ]] || { echo "$LOAD predates XDS_LOAD_APPLY; rebuild it" >&2; exit 1; }
# One from before XDS_LOAD_MESH would add ServiceEntries that no plane reads under MESH=kube.
[ "$MESH" != kube ] || [[ "$usage" == *XDS_LOAD_MESH* ]] || { echo "$LOAD predates XDS_LOAD_MESH; rebuild it" >&2; exit 1; }
ETCD="$KUBE_HOME/bin/etcd"; [ -x "$ETCD" ] || ETCD="$(command -v etcd)"
KUBECTL="$KUBE_HOME/bin/kubectl"
for b in "$CORE" "$LOAD" "$ETCD" "$KUBE_HOME/bin/kube-apiserver" "$KUBECTL" \
  "$ISTIO_HOME/bin/pilot-discovery" "$ISTIO_HOME/bin/istioctl"; do
  [ -x "$b" ] || { echo "missing $b (scripts/setup.sh --tests installs Istio and Kubernetes)" >&2; exit 1; }
done

WORK="$(mktemp -d /tmp/istbench-cp.XXXXXX)"
NS="istbench-cp-$$"
STARTED=() # pids of what this script started, stopped last first
stop() { # pid: SIGTERM, SIGKILL after 10 s (kube-apiserver drains for longer)
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
  { wait "$1"; } 2>/dev/null || true
}
cleanup() {
  for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do stop "${STARTED[$i]}"; done
  ip netns delete "$NS" 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
ip netns add "$NS"
ip -n "$NS" link set lo up
# (Background processes are started with `ip netns exec` itself, not this function, so that $! is
# their pid: ip execs the command.)
inns() { ip netns exec "$NS" "$@"; }
wait_for() { # what seconds command...
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "$what not ready in $secs s" >&2; return 1; }
    sleep 0.1
  done
}
rss() { awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; } # seconds since $1

# --- The API server: certificates, etcd, kube-apiserver (tests/kube/src/cluster.rs's flags) ---
PKI="$WORK/pki"
mkdir -p "$PKI"
cert() { # name subject [subjectAltName]
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/$1.key" \
    -out "$PKI/$1.csr" -subj "$2" 2>/dev/null
  printf 'subjectAltName=%s\n' "${3:-DNS:$1}" >"$PKI/$1.ext"
  openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 2 \
    -extfile "$PKI/$1.ext" -out "$PKI/$1.crt" 2>/dev/null
}
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/ca.key" \
  -out "$PKI/ca.crt" -days 2 -subj /CN=kube-ca 2>/dev/null
cert apiserver /CN=kube-apiserver "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
cert admin "/O=system:masters/CN=admin"
openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
KUBECONFIG_FILE="$WORK/kubeconfig"
cat >"$KUBECONFIG_FILE" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$PKI/ca.crt"}
users:
- name: admin
  user: {client-certificate: "$PKI/admin.crt", client-key: "$PKI/admin.key"}
contexts:
- name: bench
  context: {cluster: bench, user: admin}
current-context: bench
EOF
k() { inns "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

t=$(now)
ip netns exec "$NS" "$ETCD" --data-dir "$WORK/etcd" --listen-client-urls=http://127.0.0.1:2379 \
  --advertise-client-urls=http://127.0.0.1:2379 --listen-peer-urls=http://127.0.0.1:2380 \
  >"$WORK/etcd.log" 2>&1 &
ETCD_PID=$!; STARTED+=("$ETCD_PID")
ip netns exec "$NS" "$KUBE_HOME/bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 --bind-address=127.0.0.1 \
  --secure-port=6443 --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" --service-account-key-file="$PKI/sa.pub" \
  --service-account-signing-key-file="$PKI/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --api-audiences=https://kubernetes.default.svc.cluster.local,istio-ca --authorization-mode=Node,RBAC \
  --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true >"$WORK/kube-apiserver.log" 2>&1 &
APISERVER_PID=$!; STARTED+=("$APISERVER_PID")
wait_for kube-apiserver 120 inns curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" \
  --key "$PKI/admin.key" https://127.0.0.1:6443/readyz
echo "etcd + kube-apiserver ready in $(since "$t") s"

# --- Istio as tests/kube/src/istio.rs installs it: the minimal profile's objects but istiod's
# Deployment (run here as a process with its args and env), its HPA/PDB and the Service-based
# validating webhook ---
"$ISTIO_HOME/bin/istioctl" manifest generate --set profile=minimal \
  --set values.istiodRemote.injectionURL=https://localhost:15017/inject >"$WORK/istio.yaml"
python3 - "$WORK" <<'PY'
import re, sys
work = sys.argv[1]
docs = re.split(r"^---\s*$", open(f"{work}/istio.yaml").read(), flags=re.M)
keep, deploy = [], []
for d in docs:
    m = re.search(r"^kind: (\w+)", d, re.M)
    if not m:
        continue
    if m.group(1) == "Deployment":
        deploy.append(d)
    elif m.group(1) not in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "ValidatingWebhookConfiguration"):
        keep.append(d)
open(f"{work}/istio-apply.yaml", "w").write("---".join(keep))
open(f"{work}/istiod-deployment.yaml", "w").write(deploy[0])
PY
k create namespace istio-system >/dev/null
k create namespace load >/dev/null
k apply --server-side -f "$WORK/istio-apply.yaml" >/dev/null
k wait --for condition=established crd --all --timeout=60s >/dev/null
# istiod's command line and env from its Deployment, the downward API resolved as for a pod
# istiod-0 on a node with this machine's cores (no CPU limit: GOMAXPROCS is the node's allocatable).
k create --dry-run=client -o json -f "$WORK/istiod-deployment.yaml" >"$WORK/istiod-deployment.json"
python3 - "$WORK" "$(nproc)" "$KUBECONFIG_FILE" <<'PY'
import json, sys
work, cores, kubeconfig = sys.argv[1:]
d = json.load(open(f"{work}/istiod-deployment.json"))
spec = d["spec"]["template"]["spec"]
c = next(c for c in spec["containers"] if c["name"] == "discovery")
fields = {"metadata.name": "istiod-0", "metadata.namespace": "istio-system",
          "spec.serviceAccountName": spec.get("serviceAccountName", "istiod")}
env = []
for e in c.get("env", []):
    v = e.get("value", "")
    src = e.get("valueFrom", {})
    if "fieldRef" in src:
        v = fields[src["fieldRef"]["fieldPath"]]
    elif "resourceFieldRef" in src:
        v = cores if src["resourceFieldRef"]["resource"] == "limits.cpu" else ""
    if e["name"] == "KUBECONFIG":
        v = kubeconfig
    env.append(f"{e['name']}={v}")
env.append("ISTIOD_CUSTOM_HOST=localhost")
open(f"{work}/istiod.env", "w").write("\n".join(env) + "\n")
open(f"{work}/istiod.args", "w").write("\n".join(c["args"] + [f"--kubeconfig={kubeconfig}"]) + "\n")
PY
mapfile -t ISTIOD_ENV <"$WORK/istiod.env"
mapfile -t ISTIOD_ARGS <"$WORK/istiod.args"

# The API server client of the runs: persistent HTTPS connections that apply each document they
# read (documents end with `---`; a line `...` ends a batch and is answered `ok N`), without a process
# start per change (`--serve`: xds-load's XDS_LOAD_APPLY command, connected before the first change).
# A ServiceEntry: a server-side apply, as `kubectl apply --server-side` would, at once. MESH=kube's
# Pods and Services (scripts/gen-mesh.py --kube) are applied at the end of their batch: each Pod
# created (an existing one deleted first, grace 0: an endpoint move is a pod replaced) and made Ready
# with a running container at its `podIP` through the status subresource, as a kubelet would; then
# the EndpointSlice of each Service whose pods changed is written from every pod of it known here,
# as the EndpointSlice controller would (no kube-controller-manager runs); then the Services
# (server-side apply). Pods, slices and Services each go 4 requests at a time.
cat >"$WORK/apply.py" <<'PY'
import http.client, json, re, ssl, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
pki = sys.argv[1]
ctx = ssl.create_default_context(cafile=f"{pki}/ca.crt")
ctx.load_cert_chain(f"{pki}/admin.crt", f"{pki}/admin.key")
local = threading.local()
def call(method, path, body=None, ctype=None):
    for attempt in (0, 1):
        try:
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPSConnection("127.0.0.1", 6443, context=ctx)
            local.conn.request(method, path, body=body, headers={"Content-Type": ctype} if ctype else {})
            r = local.conn.getresponse()
            return r.status, r.read()
        except (http.client.HTTPException, OSError):
            local.conn = None
            if attempt:
                raise
pool = ThreadPoolExecutor(4)
META = re.compile(r"^metadata:\s*\{name:\s*([^,}\s]+),\s*namespace:\s*([^,}\s]+)", re.M)
APP = re.compile(r"labels:\s*\{app:\s*([^,}\s]+)")
POD_IP = re.compile(r"^status:\s*\{podIP:\s*([\d.]+)\}\s*$", re.M)
KIND = re.compile(r"^kind: (\w+)", re.M)
def apply_se(doc, name, ns):
    status, body = call("PATCH", f"/apis/networking.istio.io/v1/namespaces/{ns}/serviceentries/{name}"
                        "?fieldManager=bench-control-plane&force=true", doc.encode(),
                        "application/apply-patch+yaml")
    return None if status in (200, 201) else f"{name}: {status} {body[:300]!r}"
# MESH=kube: the pods of each service (by its `app` label) known here: name -> address.
pods = {}
def pod_status(ip):
    ready = [{"type": t, "status": "True"} for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
    return {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": ready,
                       "containerStatuses": [{"name": "app", "ready": True, "started": True, "restartCount": 0,
                                              "image": "bench/app:1", "imageID": "",
                                              "state": {"running": {"startedAt": "2026-11-25T00:00:00Z"}}}]}}
def apply_pod(doc, name, ns, ip):
    base = f"/api/v1/namespaces/{ns}/pods"
    spec = POD_IP.sub("", doc).encode()
    status, body = call("POST", base, spec, "application/yaml")
    if status == 409:
        status, body = call("DELETE", f"{base}/{name}", json.dumps({"gracePeriodSeconds": 0}).encode(),
                            "application/json")
        if status not in (200, 202):
            return f"delete pod {name}: {status} {body[:300]!r}"
        status, body = call("POST", base, spec, "application/yaml")
    if status != 201:
        return f"pod {name}: {status} {body[:300]!r}"
    status, body = call("PATCH", f"{base}/{name}/status", json.dumps(pod_status(ip)).encode(),
                        "application/merge-patch+json")
    return None if status == 200 else f"pod {name} status: {status} {body[:300]!r}"
def apply_slice(ns, svc):
    eps = [{"addresses": [ip], "conditions": {"ready": True, "serving": True, "terminating": False},
            "nodeName": "bench-node", "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}}
           for pod, ip in sorted(pods[(ns, svc)].items())]
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": f"{svc}-bench", "namespace": ns,
                           "labels": {"kubernetes.io/service-name": svc,
                                      "endpointslice.kubernetes.io/managed-by": "bench-control-plane"}},
              "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
              "endpoints": eps}
    status, body = call("PATCH", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{svc}-bench"
                        "?fieldManager=bench-control-plane&force=true", json.dumps(slice_).encode(),
                        "application/apply-patch+yaml")
    return None if status in (200, 201) else f"slice {svc}: {status} {body[:300]!r}"
def apply_service(doc, name, ns):
    status, body = call("PATCH", f"/api/v1/namespaces/{ns}/services/{name}"
                        "?fieldManager=bench-control-plane&force=true", doc.encode(),
                        "application/apply-patch+yaml")
    return None if status in (200, 201) else f"service {name}: {status} {body[:300]!r}"
kube_pods, kube_services = [], []
def apply(doc):
    m, kind = META.search(doc), KIND.search(doc)
    if not m or not kind:
        return f"not a document of this bench: {doc[:80]!r}"
    name, ns = m.groups()
    if kind.group(1) == "ServiceEntry":
        return apply_se(doc, name, ns)
    if kind.group(1) == "Pod" and APP.search(doc) and POD_IP.search(doc):
        kube_pods.append((doc, name, ns, APP.search(doc).group(1), POD_IP.search(doc).group(1)))
    elif kind.group(1) == "Service":
        kube_services.append((doc, name, ns))
    else:
        return f"not a document of this bench: {doc[:80]!r}"
def apply_kube():
    global kube_pods, kube_services
    errors = list(pool.map(lambda p: apply_pod(p[0], p[1], p[2], p[4]), kube_pods))
    touched = set()
    for _, name, ns, app, ip in kube_pods:
        pods.setdefault((ns, app), {})[name] = ip
        touched.add((ns, app))
    errors += pool.map(lambda t: apply_slice(*t), sorted(touched))
    errors += pool.map(lambda s: apply_service(*s), kube_services)
    kube_pods, kube_services = [], []
    return [e for e in errors if e]
def wait_empty(path):
    for _ in range(600):
        status, body = call("GET", f"{path}?limit=1")
        if status == 200 and not json.loads(body)["items"]:
            return
        time.sleep(0.1)
    sys.exit(f"{path} not empty after 60 s")
if sys.argv[2:] == ["--delete-all"]:
    status, body = call("DELETE", "/apis/networking.istio.io/v1/namespaces/load/serviceentries")
    sys.exit(0 if status == 200 else f"delete: {status} {body[:300]!r}")
if sys.argv[2:] == ["--delete-kube"]:  # MESH=kube: every Service, Pod and EndpointSlice of `load`
    status, body = call("GET", "/api/v1/namespaces/load/services")
    names = [s["metadata"]["name"] for s in json.loads(body)["items"]]
    codes = pool.map(lambda n: call("DELETE", f"/api/v1/namespaces/load/services/{n}")[0], names)
    bad = [f"service {n}: {c}" for n, c in zip(names, codes) if c != 200]
    for path, extra in (("/api/v1/namespaces/load/pods", "?gracePeriodSeconds=0"),
                        ("/apis/discovery.k8s.io/v1/namespaces/load/endpointslices", "")):
        status, body = call("DELETE", path + extra)
        if status != 200:
            bad.append(f"{path}: {status} {body[:300]!r}")
        wait_empty(path)
    wait_empty("/api/v1/namespaces/load/services")
    sys.exit(f"delete: {bad}" if bad else 0)
if sys.argv[2:] == ["--serve"]:  # for xds-load: connected, the pods known, then says so
    status, body = call("GET", "/api/v1/namespaces/load/pods")
    for p in json.loads(body)["items"]:
        app, ip = p["metadata"].get("labels", {}).get("app"), p.get("status", {}).get("podIP")
        if app and ip:
            pods.setdefault((p["metadata"]["namespace"], app), {})[p["metadata"]["name"]] = ip
    print("ready", flush=True)
doc, n, errors = [], 0, []
def flush():
    global doc, n
    text = "".join(doc).strip()
    doc = []
    if text:
        n += 1
        e = apply(text)
        if e:
            errors.append(e)
for line in sys.stdin:
    if line.rstrip() == "---":
        flush()
    elif line.rstrip() == "...":
        flush()
        errors += apply_kube()
        print(f"error {errors}" if errors else f"ok {n}", flush=True)
        n, errors = 0, []
    else:
        doc.append(line)
flush()
errors += apply_kube()
if errors:
    sys.exit(f"apply: {errors[:5]} ({len(errors)} errors)")
PY
apply_file() { inns python3 "$WORK/apply.py" "$PKI" <"$1"; }

gen_mesh() { # file services endpoints
  if [ "$MESH" = kube ]; then python3 scripts/gen-mesh.py "$@" --kube; else python3 scripts/gen-mesh.py "$@"; fi
}

# What a sidecar's agent puts in its node metadata that istiod reads (namespace, version, cluster).
export XDS_LOAD_META="NAMESPACE=load,ISTIO_VERSION=1.31.0,CLUSTER_ID=Kubernetes"
if [ "$MESH" = kube ]; then export XDS_LOAD_MESH=kube; fi
if [ "$MESH" = kube ]; then
  # The pods' service account and node (its labels give the endpoints' locality).
  k create serviceaccount bench-app -n load >/dev/null
  k apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: bench-node
  labels: {topology.kubernetes.io/region: bench-region, topology.kubernetes.io/zone: bench-zone, kubernetes.io/hostname: bench-node}
EOF
  k patch node bench-node --subresource=status --type=merge \
    -p '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"bench"}]}}' >/dev/null
fi

# The mesh in the API server: MESH=serviceentry for istiod only (istiod-core reads the file), MESH=kube
# for both planes, reset before each (a run's rounds change it).
load_mesh() { # services endpoints
  local t; t=$(now)
  if [ "$MESH" = kube ]; then
    inns python3 "$WORK/apply.py" "$PKI" --delete-kube
    apply_file "$WORK/mesh/mesh.yaml"
    echo "$1 Services x $2 Pods (Ready) and their EndpointSlices applied to the API server in $(since "$t") s"
    # The data: the objects as the API server lists them (JSON), without their managedFields.
    for kind in api/v1/namespaces/load/pods api/v1/namespaces/load/services \
      apis/discovery.k8s.io/v1/namespaces/load/endpointslices; do
      k get --raw "/$kind" | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
for i in items:
    i["metadata"].pop("managedFields", None)
size = sum(len(json.dumps(i, separators=(",", ":"))) for i in items)
print(f"  {sys.argv[1]}: {len(items)}, {size / max(len(items), 1):.0f} bytes of JSON each (no managedFields)")' "${kind##*/}"
    done
  else
    inns python3 "$WORK/apply.py" "$PKI" --delete-all
    apply_file "$WORK/mesh/mesh.yaml"
    echo "istiod: $1 ServiceEntries applied to the API server in $(since "$t") s"
  fi
}

start_istiod() { # label; sets PID
  mkdir -p "$WORK/istiod-$1"
  local t; t=$(now)
  (cd "$WORK/istiod-$1" && exec ip netns exec "$NS" env "${ISTIOD_ENV[@]}" \
    "$ISTIO_HOME/bin/pilot-discovery" "${ISTIOD_ARGS[@]}") >"$WORK/istiod-$1.log" 2>&1 &
  PID=$!; STARTED+=("$PID")
  wait_for istiod 120 inns curl -sf http://127.0.0.1:8080/ready
  echo "istiod ready in $(since "$t") s"
}

# istiod-core's xDS port. With --kubeconfig its CA is on (istiod's, from the cluster's Secrets), and
# it serves TLS on any port but 15010 (Istio's plaintext port), where xds-load (plaintext) dials it.
CORE_PORT=15710; [ "$MESH" = kube ] && CORE_PORT=15010
start_core() { # label; sets PID
  local t; t=$(now)
  if [ "$MESH" = kube ]; then
    PILOT_DEBOUNCE_AFTER=100ms POD_NAMESPACE=istio-system ip netns exec "$NS" "$CORE" serve \
      --kubeconfig "$KUBECONFIG_FILE" --grpc-addr "127.0.0.1:$CORE_PORT" --debug-addr 127.0.0.1:15714 >"$WORK/istiod-core-$1.log" 2>&1 &
  else
    PILOT_DEBOUNCE_AFTER=100ms ip netns exec "$NS" "$CORE" serve --config-dir "$WORK/mesh" \
      --grpc-addr 127.0.0.1:15710 >"$WORK/istiod-core-$1.log" 2>&1 &
  fi
  PID=$!; STARTED+=("$PID")
  wait_for istiod-core 90 inns bash -c "exec 3<>/dev/tcp/127.0.0.1/$CORE_PORT"
  echo "istiod-core serving in $(since "$t") s"
}

# istiod's Go heap in use (MiB), from its metrics: its RSS also holds garbage not yet collected.
go_heap() { inns curl -sf http://127.0.0.1:15014/metrics |
  awk '/^go_memstats_heap_inuse_bytes / {printf "%.1f", $2 / 1048576}'; }

# RSS with the registry listed and no proxy connected, SETTLE s after ready; written to
# $WORK/registry-PLANE-LABEL.txt for the side-by-side table.
SETTLE="${SETTLE:-5}"
registry_rss() { # plane pid label
  sleep "$SETTLE"
  local line
  local peak; peak=$(awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$2/status")
  if [ "$1" = istiod ]; then
    line="RSS $(rss "$2") MiB (peak $peak MiB), Go heap in use $(go_heap) MiB"
  else
    line="RSS $(rss "$2") MiB (peak $peak MiB)"
  fi
  echo "$line" >"$WORK/registry-$1-$3.txt"
  echo "$1 before any proxy ($SETTLE s after ready): $line"
}

# MESH=kube, 50 services only (the JSON is large at 1000): what a plane made of the registry, from
# its debug endpoint (after the RSS above): services of namespace load, svc0's endpoints, one of them.
check_registry() { # url
  [ "$MESH" = kube ] && [ "$1" != "" ] || return 0
  inns curl -sf "$1" | python3 -c '
import json, sys
j = json.load(sys.stdin)
def eps(v):
    if isinstance(v, dict):
        if any("ddress" in k for k in v):
            yield v
        else:
            for x in v.values():
                yield from eps(x)
    elif isinstance(v, list):
        for x in v:
            yield from eps(x)
hosts = [h for h in j if h.endswith(".load.svc.cluster.local")]
svc0 = list(eps(j.get("svc0.load.svc.cluster.local", {})))
print(f"  registry check: {len(hosts)} services of namespace load; svc0: {len(svc0)} endpoints; one: "
      + json.dumps(svc0[0] if svc0 else None, separators=(",", ":"))[:400])' || echo "  registry check failed"
}

run_istiod() { # services rounds label
  start_istiod "$3"
  local pid=$PID
  registry_rss istiod "$pid" "$3"
  [ "$1" -gt 100 ] || check_registry http://127.0.0.1:15014/debug/endpointShardz
  cp "$WORK/mesh/mesh.yaml" "$WORK/istiod-mesh.yaml" # the copy xds-load edits; istiod reads the API
  XDS_LOAD_APPLY="python3 $WORK/apply.py $PKI --serve" \
    inns "$LOAD" 127.0.0.1:15010 "$CLIENTS" "$WORK/istiod-mesh.yaml" "$2" 100 \
    "$pid,$APISERVER_PID,$ETCD_PID" 2>&1 | tee "$WORK/out-istiod-$3.txt"
  inns curl -sf http://127.0.0.1:15014/metrics >"$WORK/istiod-$3.metrics" || true
  echo "istiod's own counters (pushes by type, rejects, convergence histogram, Go heap):"
  grep -E '^pilot_xds_pushes\{|^pilot_total_xds_rejects|^pilot_proxy_convergence_time_(sum|count)|^go_memstats_heap_(inuse|idle|released)_bytes ' \
    "$WORK/istiod-$3.metrics" | sed 's/^/  /' || true
  echo "  streams refused over PILOT_MAX_REQUESTS_PER_SECOND (retried by xds-load): $(grep -c 'exceeded rate limit' "$WORK/istiod-$3.log" || true)"
  stop "$pid"
}

run_core() { # services rounds label
  start_core "$3"
  local pid=$PID
  registry_rss istiod-core "$pid" "$3"
  [ "$1" -gt 100 ] || check_registry http://127.0.0.1:15714/debug/endpointz
  if [ "$MESH" = kube ]; then
    cp "$WORK/mesh/mesh.yaml" "$WORK/core-mesh.yaml" # the copy xds-load edits; istiod-core reads the API
    XDS_LOAD_APPLY="python3 $WORK/apply.py $PKI --serve" \
      inns "$LOAD" "127.0.0.1:$CORE_PORT" "$CLIENTS" "$WORK/core-mesh.yaml" "$2" 100 \
      "$pid,$APISERVER_PID,$ETCD_PID" 2>&1 | tee "$WORK/out-istiod-core-$3.txt"
  else
    inns "$LOAD" "127.0.0.1:$CORE_PORT" "$CLIENTS" "$WORK/mesh/mesh.yaml" "$2" 100 "$pid" 2>&1 \
      | tee "$WORK/out-istiod-core-$3.txt"
  fi
  stop "$pid"
}

run() { # services endpoints rounds label
  mkdir -p "$WORK/mesh"; rm -f "$WORK/mesh/"*
  gen_mesh "$WORK/mesh/mesh.yaml" "$1" "$2"
  if plane istiod; then
    echo "### istiod (Istio $(basename "$ISTIO_HOME"))"
    load_mesh "$1" "$2"
    run_istiod "$1" "$3" "$4"; echo
  fi
  if plane istiod-core; then
    echo "### istiod-core"
    if [ "$MESH" = kube ]; then load_mesh "$1" "$2"; fi
    run_core "$1" "$3" "$4"; echo
  fi
}

# MESH=kube, memory part: each plane's RSS with the registry listed and no proxy, on a cluster
# without the mesh (Istio's own objects, the node, the namespaces).
registry_empty() {
  echo "## registry only: no Services, Pods or EndpointSlices in namespace load"
  inns python3 "$WORK/apply.py" "$PKI" --delete-kube
  if plane istiod; then start_istiod empty; registry_rss istiod "$PID" empty; stop "$PID"; fi
  if plane istiod-core; then start_core empty; registry_rss istiod-core "$PID" empty; stop "$PID"; fi
}

if part convergence; then
  echo
  echo "## convergence: 50 services x 10 endpoints, $CLIENTS sidecars, $ROUNDS rounds (MESH=$MESH)"
  run 50 10 "$ROUNDS" convergence
fi
if part memory; then
  echo
  if [ "$MESH" = kube ]; then registry_empty; fi
  echo "## memory and CPU: 1000 services x 10 endpoints, $CLIENTS sidecars, $MEM_ROUNDS rounds (MESH=$MESH)"
  run 1000 10 "$MEM_ROUNDS" memory
fi

# Side by side: each figure of both control planes, and istiod's over istiod-core's.
python3 - "$WORK" <<'PY'
import os, re, sys
work = sys.argv[1]
def load(plane, part):
    try:
        return open(f"{work}/out-{plane}-{part}.txt").read()
    except OSError:
        return None
rows = []
def pct(text, change, base):
    m = re.search(rf"^{change}.*{base}: p50 ([\d.]+) ms, p90 ([\d.]+) ms, p99 ([\d.]+) ms", text, re.M)
    return [float(v) for v in m.groups()] if m else None
for part, label in (("convergence", "50 services"), ("memory", "1000 services")):
    a, b = load("istiod", part), load("istiod-core", part)
    if a is None or b is None:
        continue
    for change, what in (("endpoint change", "endpoint change -> EDS"), ("new service", "new service -> CDS+EDS+LDS")):
        for base, how in (("from the change", "from the change"), ("after the debounce", "minus 100 ms debounce")):
            x, y = pct(a, change, base), pct(b, change, base)
            if x and y:
                rows.append((f"{label}: {what}, {how}, p50 / p90 / p99 (ms)",
                             " / ".join(f"{v:.0f}" for v in x), " / ".join(f"{v:.0f}" for v in y),
                             " / ".join(f"{p / q:.1f}x" if q else "-" for p, q in zip(x, y))))
    def num(text, pattern):
        m = re.search(pattern, text, re.M)
        return float(m.group(1)) if m else None
    for name, pattern in (
        ("RSS once all proxies are configured (MiB)", r"configured in .*server RSS ([\d.]+) MiB"),
        ("RSS after the rounds (MiB)", r"server RSS after the rounds: ([\d.]+) MiB"),
        ("peak RSS, VmHWM (MiB)", r"peak RSS of the whole run: ([\d.]+) MiB"),
        ("CPU s to configure all proxies", r"CPU to configure them: server ([\d.]+) s"),
        ("CPU s per endpoint push (round)", r"CPU per endpoint-change round: server ([\d.]+) s"),
        ("CPU s per full push (new-service round)", r"CPU per new-service round \(full push\): server ([\d.]+) s"),
    ):
        x, y = num(a, pattern), num(b, pattern)
        if x is not None and y is not None:
            rows.append((f"{label}: {name}", f"{x:g}", f"{y:g}", f"{x / y:.1f}x" if y else "-"))
# Before any proxy: RSS with the registry listed (and istiod's Go heap in use), on the cluster without
# the mesh (MESH=kube's memory part) and with it; the difference over the mesh's objects.
def registry(plane, label):
    try:
        text = open(f"{work}/registry-{plane}-{label}.txt").read()
    except OSError:
        return None, None
    rss = re.search(r"RSS ([\d.]+) MiB", text)
    heap = re.search(r"Go heap in use ([\d.]+) MiB", text)
    return (float(rss.group(1)) if rss else None), (float(heap.group(1)) if heap else None)
for label, what in (("empty", "no Services/Pods/EndpointSlices"), ("convergence", "50 services"),
                    ("memory", "1000 services")):
    (x, hx), (y, _) = registry("istiod", label), registry("istiod-core", label)
    if x is not None and y is not None:
        rows.append((f"before any proxy, {what}: RSS (MiB)", f"{x:g}", f"{y:g}", f"{x / y:.1f}x" if y else "-"))
    if hx is not None:
        rows.append((f"before any proxy, {what}: istiod's Go heap in use (MiB)", f"{hx:g}", "-", "-"))
(xe, hxe), (ye, _) = registry("istiod", "empty"), registry("istiod-core", "empty")
(xm, hxm), (ym, _) = registry("istiod", "memory"), registry("istiod-core", "memory")
if None not in (xe, ye, xm, ym):
    # 1000 Services, 10000 Pods, 1000 EndpointSlices (10000 endpoints): one Service's share.
    dx, dy = (xm - xe) * 1024 / 1000, (ym - ye) * 1024 / 1000
    rows.append(("RSS with 1000 x 10 minus without, per Service with its 10 Pods and EndpointSlice (KiB)",
                 f"{dx:.0f}", f"{dy:.0f}", f"{dx / dy:.1f}x" if dy else "-"))
    if None not in (hxe, hxm):
        rows.append(("the same of istiod's Go heap in use (KiB)", f"{(hxm - hxe) * 1024 / 1000:.0f}", "-", "-"))
if rows:
    print("\n## side by side\n")
    print("| | istiod | istiod-core | istiod / istiod-core |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
PY
