#!/usr/bin/env bash
# Runs the sidecar path end to end on this machine: two pods (network namespaces on a bridge),
# each with istio-iptables and pilot-agent + Envoy, the embedded control plane reading
# examples/demo-mesh. The client calls the server by its service VIP; the summary shows the
# response and the Envoy counters proving the request went through both sidecars.
#   ./scripts/demo.sh          run, print a summary, clean up, exit 0
#   ./scripts/demo.sh --keep   leave the mesh running and print how to reach it
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
KEEP=false
STOP=false
case "${1:-}" in
  --keep) KEEP=true ;;
  --stop) STOP=true ;;
  "") ;;
  *) echo "usage: $0 [--keep|--stop]" >&2; exit 2 ;;
esac

if ! $STOP; then
  ./scripts/setup.sh
  echo "== building release binaries"
  cargo build --release --quiet -p istio-init -p pilot-agent -p istio-module
fi
BIN="$ROOT/target/release"

P=istdemo
HUB="$P-hub"
WORK="$(mktemp -d /tmp/istdemo.XXXXXX)"
chmod 0755 "$WORK"
VIP=10.234.0.10
PORT=8000
APP_UID=1000

cleanup() {
  for ns in "$P-client" "$P-server" "$HUB"; do
    if ip netns list | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
    fi
  done
  sleep 1.5
  for ns in "$P-client" "$P-server" "$HUB"; do
    if ip netns list | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
      ip netns delete "$ns"
    fi
  done
  rm -rf "$WORK"
}

# A previous --keep run may still be up.
cleanup >/dev/null 2>&1 || true
rm -rf /tmp/istdemo.*
if $STOP; then echo "demo stopped"; exit 0; fi
WORK="$(mktemp -d /tmp/istdemo.XXXXXX)"; chmod 0755 "$WORK"
if ! $KEEP; then trap cleanup EXIT; fi
trap 'echo; echo "interrupted; cleaning up"; cleanup; exit 130' INT TERM

echo "== creating pods"
ip netns add "$HUB"
ip -n "$HUB" link add br0 type bridge
ip -n "$HUB" link set br0 up
n=2
for pod in client server; do
  ns="$P-$pod"
  ip netns add "$ns"
  ip -n "$HUB" link add "v$n" type veth peer name eth0 netns "$ns"
  ip -n "$HUB" link set "v$n" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.233.0.$n/24" dev eth0
  ip -n "$ns" -6 addr add "fd00:233::$n/64" dev eth0 nodad
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add 10.234.0.0/16 dev eth0
  mkdir -p "$WORK/$pod"; chmod 0755 "$WORK/$pod"
  echo "   $ns: 10.233.0.$n"
  n=$((n + 1))
done

echo "== server app (uid $APP_UID): python3 http.server on :$PORT"
mkdir -p "$WORK/server/www"
echo "hello from the server pod, through two sidecars" > "$WORK/server/www/index.html"
ip netns exec "$P-server" setpriv --reuid "$APP_UID" --regid "$APP_UID" --clear-groups -- \
  /usr/bin/python3 -m http.server "$PORT" --bind 0.0.0.0 --directory "$WORK/server/www" \
  >"$WORK/server/app.log" 2>&1 &

echo "== istio-iptables (the injector's init container args)"
for pod in client server; do
  ip netns exec "$P-$pod" "$BIN/istio-iptables" -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" \
    -b '*' -d 15090,15021,15020 --log_output_level=default:info 2>"$WORK/$pod/init.log"
  echo "   $P-$pod: $(grep -c '^-A' < <(ip netns exec "$P-$pod" iptables-save -t nat)) nat rules"
done

echo "== pilot-agent proxy sidecar (embedded control plane and CA: a copy of examples/demo-mesh)"
# The embedded CA keeps its root in the config directory (cacerts/): use a copy, not the repo.
cp -r "$ROOT/examples/demo-mesh" "$WORK/mesh"
declare -A NAME=([client]=sleep [server]=httpbin)
# Envoy keeps Istio's stats only (its inclusion list); the summary reads three more counters, which
# the pods ask for as an Istio user would, with the sidecar.istio.io/statsInclusionPrefixes annotation
# (the downward-API file the kubelet writes).
for pod in client server; do
  mkdir -p "$WORK/$pod/etc/istio/pod"
  echo 'sidecar.istio.io/statsInclusionPrefixes="http.outbound_0.0.0.0_'"$PORT"',http.inbound_0.0.0.0_'"$PORT"',listener.0.0.0.0_15006.ssl"' \
    > "$WORK/$pod/etc/istio/pod/annotations"
  chmod -R a+rX "$WORK/$pod/etc"
done
n=2
for pod in client server; do
  (cd "$WORK/$pod" && env -i PATH="$PATH" POD_NAME="${NAME[$pod]}" POD_NAMESPACE=demo \
     INSTANCE_IP="10.233.0.$n" SERVICE_ACCOUNT="${NAME[$pod]}" ISTIO_META_CLUSTER_ID=Kubernetes \
     PROXY_CONFIG='{"terminationDrainDuration": "1s"}' \
     ip netns exec "$P-$pod" "$BIN/pilot-agent" proxy sidecar --domain demo.svc.cluster.local \
       --proxyLogLevel=warning --proxyComponentLogLevel=misc:error --log_output_level=default:info \
       --configDir "$WORK/mesh" >"$WORK/$pod/agent.log" 2>&1 &)
  n=$((n + 1))
done

for pod in client server; do
  ok=false
  for _ in $(seq 1 120); do
    if [ "$(ip netns exec "$P-$pod" curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:15021/healthz/ready)" = 200 ]; then
      ok=true; break
    fi
    sleep 0.25
  done
  $ok || { echo "$P-$pod did not become ready:"; cat "$WORK/$pod/agent.log"; exit 1; }
  echo "   $P-$pod: ready (15021/healthz/ready = 200)"
done

echo "== client app (uid $APP_UID) calls http://$VIP:$PORT/ (httpbin.demo)"
body="$(ip netns exec "$P-client" setpriv --reuid "$APP_UID" --regid "$APP_UID" --clear-groups -- \
  curl -sS --max-time 5 "http://$VIP:$PORT/")"
echo "   response: $body"

stat() { ip netns exec "$P-$1" curl -s "http://127.0.0.1:15000/stats?filter=^$2\$" | awk -F': ' '{print $2}'; }
out="$(stat client "http.outbound_0.0.0.0_${PORT}.downstream_rq_2xx")"
inb="$(stat server "http.inbound_0.0.0.0_${PORT}.downstream_rq_2xx")"
tls="$(stat server "listener.0.0.0.0_15006.ssl.handshake")"
echo
echo "== summary"
echo "   client Envoy, outbound listener 0.0.0.0_$PORT: ${out:-0} request(s) 2xx"
echo "   server Envoy, inbound  listener (virtualInbound :$PORT): ${inb:-0} request(s) 2xx"
echo "   server Envoy, mutual TLS handshakes on virtualInbound: ${tls:-0}"
if [ "${out:-0}" -ge 1 ] && [ "${inb:-0}" -ge 1 ] && [ "${tls:-0}" -ge 1 ] && [ -n "$body" ]; then
  echo "   the request went app -> client sidecar =mTLS=> server sidecar -> app"
else
  echo "   FAILED: the request did not pass through both sidecars"; exit 1
fi

if $KEEP; then
  cat <<EOT

The mesh is running (namespaces $P-client, $P-server; files in $WORK). Try:
  ip netns exec $P-client curl -s http://$VIP:$PORT/
  ip netns exec $P-client curl -s http://127.0.0.1:15000/config_dump | less    # Envoy admin
  ip netns exec $P-server curl -s http://127.0.0.1:15020/healthz/ready         # agent status
  ip netns exec $P-server curl -s http://127.0.0.1:15090/stats/prometheus      # Envoy stats
Stop it with: ./scripts/demo.sh --stop
EOT
fi
