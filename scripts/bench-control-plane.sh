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
# Usage: ./scripts/bench-control-plane.sh [rounds] (default 10). As root: every process (etcd,
# kube-apiserver, istiod, istiod-core, the load client) runs on the loopback of a network namespace
# of its own, removed at the end.
# BIN=DIR: prebuilt istiod-core and xds-load (DIR/istiod-core; DIR/examples/xds-load or DIR/xds-load),
# else a release build here. PARTS="convergence memory", PLANES="istiod istiod-core",
# CLIENTS=500, MEM_ROUNDS=6 (rounds in the memory part), KEEP=1 keeps the work directory.
# Istio from scripts/install-istio.sh ($ISTIO_HOME), Kubernetes from scripts/install-kube.sh ($KUBE_HOME).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-10}"
CLIENTS="${CLIENTS:-500}"
PARTS="${PARTS:-convergence memory}"
PLANES="${PLANES:-istiod istiod-core}"
MEM_ROUNDS="${MEM_ROUNDS:-6}"
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

# The API server client of the runs: a persistent HTTPS connection that server-side applies each
# ServiceEntry document it reads (documents end with `---`; a line `...` ends a batch and is
# answered `ok N`), as `kubectl apply --server-side` would, without a process start per change
# (`--serve`: xds-load's XDS_LOAD_APPLY command, connected before the first change).
cat >"$WORK/apply.py" <<'PY'
import http.client, re, ssl, sys
pki = sys.argv[1]
ctx = ssl.create_default_context(cafile=f"{pki}/ca.crt")
ctx.load_cert_chain(f"{pki}/admin.crt", f"{pki}/admin.key")
conn = None
def call(method, path, body=None, ctype=None):
    global conn
    for attempt in (0, 1):
        try:
            if conn is None:
                conn = http.client.HTTPSConnection("127.0.0.1", 6443, context=ctx)
            conn.request(method, path, body=body, headers={"Content-Type": ctype} if ctype else {})
            r = conn.getresponse()
            return r.status, r.read()
        except (http.client.HTTPException, OSError):
            conn = None
            if attempt:
                raise
META = re.compile(r"^metadata:\s*\{name:\s*([^,}\s]+),\s*namespace:\s*([^,}\s]+)\}", re.M)
def apply(doc):
    m = META.search(doc)
    if not m or not re.search(r"^kind: ServiceEntry", doc, re.M):
        return f"not a ServiceEntry of this bench: {doc[:80]!r}"
    name, ns = m.groups()
    status, body = call("PATCH", f"/apis/networking.istio.io/v1/namespaces/{ns}/serviceentries/{name}"
                        "?fieldManager=bench-control-plane&force=true", doc.encode(),
                        "application/apply-patch+yaml")
    return None if status in (200, 201) else f"{name}: {status} {body[:300]!r}"
if sys.argv[2:] == ["--delete-all"]:
    status, body = call("DELETE", "/apis/networking.istio.io/v1/namespaces/load/serviceentries")
    sys.exit(0 if status == 200 else f"delete: {status} {body[:300]!r}")
if sys.argv[2:] == ["--serve"]:  # for xds-load: connected, then says so, before any change
    call("GET", "/readyz")
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
        print(f"error {errors}" if errors else f"ok {n}", flush=True)
        n, errors = 0, []
    else:
        doc.append(line)
flush()
if errors:
    sys.exit(f"apply: {errors}")
PY
apply_file() { inns python3 "$WORK/apply.py" "$PKI" <"$1"; }

gen_mesh() { python3 scripts/gen-mesh.py "$@"; } # file services endpoints

# What a sidecar's agent puts in its node metadata that istiod reads (namespace, version, cluster).
export XDS_LOAD_META="NAMESPACE=load,ISTIO_VERSION=1.31.0,CLUSTER_ID=Kubernetes"

run_istiod() { # services rounds label
  inns python3 "$WORK/apply.py" "$PKI" --delete-all
  local t; t=$(now)
  apply_file "$WORK/mesh/mesh.yaml"
  echo "istiod: $1 ServiceEntries applied to the API server in $(since "$t") s"
  mkdir -p "$WORK/istiod-$3"
  t=$(now)
  (cd "$WORK/istiod-$3" && exec ip netns exec "$NS" env "${ISTIOD_ENV[@]}" \
    "$ISTIO_HOME/bin/pilot-discovery" "${ISTIOD_ARGS[@]}") >"$WORK/istiod-$3.log" 2>&1 &
  local pid=$!; STARTED+=("$pid")
  wait_for istiod 120 inns curl -sf http://127.0.0.1:8080/ready
  echo "istiod ready in $(since "$t") s"
  sleep 2
  echo "istiod RSS before any proxy: $(rss "$pid") MiB"
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
  local t; t=$(now)
  PILOT_DEBOUNCE_AFTER=100ms ip netns exec "$NS" "$CORE" serve --config-dir "$WORK/mesh" --grpc-addr 127.0.0.1:15710 \
    >"$WORK/istiod-core-$3.log" 2>&1 &
  local pid=$!; STARTED+=("$pid")
  wait_for istiod-core 60 inns bash -c 'exec 3<>/dev/tcp/127.0.0.1/15710'
  echo "istiod-core serving in $(since "$t") s"
  sleep 2
  echo "istiod-core RSS before any proxy: $(rss "$pid") MiB"
  inns "$LOAD" 127.0.0.1:15710 "$CLIENTS" "$WORK/mesh/mesh.yaml" "$2" 100 "$pid" 2>&1 \
    | tee "$WORK/out-istiod-core-$3.txt"
  stop "$pid"
}

run() { # services endpoints rounds label
  mkdir -p "$WORK/mesh"; rm -f "$WORK/mesh/"*
  gen_mesh "$WORK/mesh/mesh.yaml" "$1" "$2"
  if plane istiod; then echo "### istiod (Istio $(basename "$ISTIO_HOME"))"; run_istiod "$1" "$3" "$4"; echo; fi
  if plane istiod-core; then echo "### istiod-core"; run_core "$1" "$3" "$4"; echo; fi
}

if part convergence; then
  echo
  echo "## convergence: 50 services x 10 endpoints, $CLIENTS sidecars, $ROUNDS rounds"
  run 50 10 "$ROUNDS" convergence
fi
if part memory; then
  echo
  echo "## memory and CPU: 1000 services x 10 endpoints, $CLIENTS sidecars, $MEM_ROUNDS rounds"
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
if rows:
    print("\n## side by side\n")
    print("| | istiod | istiod-core | istiod / istiod-core |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
PY
