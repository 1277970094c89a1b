#!/bin/sh
# Starts the sidecar on a VM, as Istio's istio-start.sh does (the systemd unit istio.service runs
# it): the env files from `istioctl x workload entry configure`, traffic capture by
# `pilot-agent istio-iptables` configured by that env, then `pilot-agent proxy`.
#   istio-start.sh          capture (cleanup first) and run the proxy
#   istio-start.sh run      run the proxy without touching iptables
#   istio-start.sh clean    remove the capture rules and exit (the unit's ExecStopPost, prerm)
#   istio-start.sh init ARGS / -p ...   capture with these istio-iptables args and exit
set -eu
set -a
[ -r /var/lib/istio/envoy/sidecar.env ] && . /var/lib/istio/envoy/sidecar.env
[ -r /var/lib/istio/envoy/cluster.env ] && . /var/lib/istio/envoy/cluster.env
set +a

# Defaults as Istio's script: the VM's first address, its short host name, the namespace.
if [ -z "${ISTIO_SVC_IP:-}" ]; then
  ISTIO_SVC_IP="$(ip -4 -o addr show scope global | awk '{sub("/.*", "", $4); print $4; exit}')"
fi
POD_NAME="${POD_NAME:-$(uname -n | cut -d. -f1)}"
NS="${ISTIO_NAMESPACE:-default}"
SVC="${ISTIO_SERVICE:-${POD_NAME}.${NS}}"
export CA_ADDR="${CA_ADDR:-${PILOT_ADDRESS:-istiod.${ISTIO_SYSTEM_NAMESPACE:-istio-system}.svc:15012}}"
export PROV_CERT="${PROV_CERT:-./etc/certs}"
export OUTPUT_CERTS="${OUTPUT_CERTS:-./etc/certs}"
if [ -z "${PROXY_CONFIG:-}" ]; then
  PROXY_CONFIG="{\"serviceCluster\": \"$SVC\", \"controlPlaneAuthPolicy\": \"MUTUAL_TLS\""
  [ -n "${PILOT_ADDRESS:-}" ] && PROXY_CONFIG="$PROXY_CONFIG, \"discoveryAddress\": \"$PILOT_ADDRESS\""
  PROXY_CONFIG="$PROXY_CONFIG}"
fi
export PROXY_CONFIG

capture() {
  /usr/local/bin/pilot-agent istio-iptables --cleanup-only
  /usr/local/bin/pilot-agent istio-iptables "$@"
}
if [ "${ISTIO_CUSTOM_IP_TABLES:-false}" != true ]; then
  case "${1:-}" in
    clean) exec /usr/local/bin/pilot-agent istio-iptables --cleanup-only ;;
    init) shift; capture "$@"; exit 0 ;;
    -*) capture "$@"; exit 0 ;;
    run) ;;
    *) capture ;;
  esac
fi

# The agent starts as root, runs Envoy as istio-proxy (1337) and takes that group itself, so its
# own connections match the capture's --gid-owner bypass.
cd /
mkdir -p /var/log/istio
INSTANCE_IP="$ISTIO_SVC_IP" POD_NAME="$POD_NAME" POD_NAMESPACE="$NS" \
  exec /usr/local/bin/pilot-agent proxy ${ISTIO_AGENT_FLAGS:-sidecar} \
  >>/var/log/istio/istio.log 2>>/var/log/istio/istio.err.log
