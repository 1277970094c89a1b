#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs into fuzz/seeds/<target>/ (committed; run again after
changing it): the repo's config (goldens, the demo mesh) as YAML and JSON, the YAML examples of
an optional extra directory of text files (`--extra DIR`: every `apiVersion:`/`kind:` block), and
hand-built inputs for the binary formats (gRPC frames of xDS requests, DNS queries with an NDS
name table, CSRs made with openssl), and the xDS responses a real istiod sent a sidecar
(tests/fixtures/istiod-1.31). Needs python3; PyYAML (JSON copies) and openssl (CSRs) are
used when present."""

import argparse
import hashlib
import json
import os
import pathlib
import re
import struct
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "seeds"


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


# --- protobuf, just enough to write requests ---------------------------------------------------

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def grpc_frame(msg):
    return b"\0" + struct.pack(">I", len(msg)) + msg


CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
NDS = "type.googleapis.com/istio.networking.nds.v1.NameTable"
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
NODES = [
    "sidecar~10.1.0.11~productpage-1.default~default.svc.cluster.local",
    "router~10.1.0.60~ingress-1.istio-system~istio-system.svc.cluster.local",
]


def node(node_id, labels=None):
    meta = b""
    if labels:
        # google.protobuf.Struct LABELS = {app: ...}
        inner = b"".join(
            field(1, field(1, k) + field(2, field(3, v))) for k, v in labels.items()
        )
        meta = field(1, field(1, "LABELS") + field(2, field(5, inner)))
    return field(1, node_id) + (field(6, meta) if meta else b"")


def sotw(type_url, node_id=None, names=(), nonce="", version="", error=""):
    m = b""
    if version:
        m += field(1, version)
    if node_id:
        m += field(2, node(node_id, {"app": "productpage"}))
    for n in names:
        m += field(3, n)
    m += field(4, type_url)
    if nonce:
        m += field(5, nonce)
    if error:
        m += field(6, varint(1 << 3 | 0) + varint(3) + field(2, error))
    return m


def delta(type_url, node_id=None, subscribe=(), unsubscribe=(), initial=None, nonce=""):
    m = b""
    if node_id:
        m += field(1, node(node_id))
    m += field(2, type_url)
    for n in subscribe:
        m += field(3, n)
    for n in unsubscribe:
        m += field(4, n)
    for k, v in (initial or {}).items():
        m += field(5, field(1, k) + field(2, v))
    if nonce:
        m += field(6, nonce)
    return m


def xds_seeds():
    for node_id in NODES:
        stream = [
            sotw(CDS, node_id),
            sotw(LDS, node_id),
            sotw(EDS, node_id, ["outbound|9080||reviews.default.svc.cluster.local"]),
            sotw(RDS, node_id, ["9080", "80"]),
            sotw(NDS, node_id),
            sotw(SECRET, node_id, ["kubernetes://bookinfo-cert"]),
            sotw(CDS, node_id, nonce="1-1", version="1"),
            sotw(LDS, node_id, nonce="1-2", error="rejected"),
        ]
        body = b"".join(grpc_frame(m) for m in stream)
        put("ads_request", b"\x00" + body)
        put("ads_request", b"\x0e" + body)  # 7-byte pieces
        put("grpc_frames", b"\x00" + body)
        put("grpc_frames", b"\x05" + body)
        dstream = [
            delta(CDS, node_id),
            delta(LDS, node_id, initial={"virtualInbound": "00000000000000ff"}),
            delta(EDS, node_id, ["outbound|9080||reviews.default.svc.cluster.local"]),
            delta(RDS, node_id, ["9080"], ["80"], nonce="1-3"),
            delta(NDS, node_id),
        ]
        put("ads_request", b"\x01" + b"".join(grpc_frame(m) for m in dstream))
    put("ads_request", b"\x00" + grpc_frame(sotw(CDS)))  # no node
    put("ads_request", b"\x00" + grpc_frame(sotw(CDS, "sidecar~bad")))
    put("grpc_frames", b"\x01" + b"\x01\x00\x00\x00\x01x")  # compressed
    put("grpc_frames", b"\x00" + b"\x00\xff\xff\xff\xff")  # too large


# --- DNS ----------------------------------------------------------------------------------------

def name_table(entries):
    t = b""
    for host, (ips, registry, short, ns) in entries.items():
        info = b"".join(field(1, ip) for ip in ips)
        info += field(2, registry) + field(3, short) + field(4, ns)
        t += field(1, field(1, host) + field(2, info))
    return t


def dns_query(name, qtype, qid=0x1234, edns=False):
    flags = 0x0100  # recursion desired
    q = struct.pack(">HHHHHH", qid, flags, 1, 0, 0, 1 if edns else 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", qtype, 1)
    if edns:
        q += b"\0" + struct.pack(">HHIH", 41, 4096, 0, 0)
    return q


def dns_seeds():
    table = name_table(
        {
            "reviews.default.svc.cluster.local": (["10.96.1.7", "fd00::7"], "Kubernetes", "reviews", "default"),
            "api.example.com": (["192.0.2.1"], "External", "", ""),
        }
    )
    prefix = struct.pack(">H", len(table)) + table
    for name, qtype in [
        ("reviews.default.svc.cluster.local", 1),
        ("reviews.default.svc.cluster.local", 28),
        ("reviews", 1),
        ("reviews.default", 1),
        ("reviews.default.svc", 28),
        ("reviews.default.svc.cluster.local.default.svc.cluster.local", 1),
        ("api.example.com", 1),
        ("unknown.example.org", 1),
        ("reviews.default.svc.cluster.local", 16),
    ]:
        put("dns_query", prefix + dns_query(name, qtype))
        put("dns_query", prefix + dns_query(name, qtype, edns=True))
    put("dns_query", b"\0\0" + dns_query("api.example.com", 1))


# --- CSRs ---------------------------------------------------------------------------------------

def csr_seeds():
    ident = b"spiffe://cluster.local/ns/default/sa/default\n"
    ttl = struct.pack(">i", 3600)
    with tempfile.TemporaryDirectory() as tmp:
        for i, key in enumerate([["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
                                 ["-newkey", "rsa:2048"]]):
            base = [
                "openssl", "req", "-new", "-nodes", *key,
                "-keyout", os.path.join(tmp, f"k{i}"), "-subj", "/O=fuzz",
                "-addext", "subjectAltName=URI:spiffe://cluster.local/ns/other/sa/admin",
            ]
            try:
                der = subprocess.run(base + ["-outform", "DER"], check=True,
                                     capture_output=True).stdout
                pem = subprocess.run(base + ["-outform", "PEM"], check=True,
                                     capture_output=True).stdout
            except (OSError, subprocess.CalledProcessError):
                print("seeds: openssl not usable; no CSR seeds")
                return
            put("ca_csr", b"\x01" + ttl + ident + der)
            put("ca_csr", b"\x00" + ttl + ident + pem)
            put("ca_csr", b"\x00" + struct.pack(">i", 0) + b"not an identity\n" + pem)
    put("ca_csr", b"\x00" + ttl + ident + b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n")


# --- text formats -------------------------------------------------------------------------------

def config_seeds(extra):
    texts = []
    for p in sorted((ROOT / "istiod-core" / "tests" / "golden").glob("*.yaml")):
        texts.append(p.read_text())
    texts.append((ROOT / "examples" / "demo-mesh" / "mesh.yaml").read_text())
    for d in extra:
        for p in sorted(pathlib.Path(d).iterdir()):
            if not p.is_file():
                continue
            text = p.read_text(errors="replace")
            # Fenced or indented YAML examples: runs of lines from `apiVersion:` up to a blank
            # line followed by prose, or a fence.
            for block in re.findall(r"(?ms)^(apiVersion:.*?)(?=^```|\n\s*\n(?![ \-a-zA-Z]*:)|\Z)", text):
                texts.append(block)
    for t in texts:
        put("config_store", t)
    try:
        import yaml
    except ImportError:
        print("seeds: no PyYAML; no JSON copies of the config seeds")
        return
    for t in texts:
        try:
            docs = [d for d in yaml.safe_load_all(t) if d is not None]
        except yaml.YAMLError:
            continue
        for d in docs:
            put("config_store", json.dumps(d, indent=1))


def duration_seeds():
    for s in ["100ms", "1.5s", "2m", "1h30m", "1m30.5s", ".5s", "1.s", "0", "+5s", " 10us ",
              "10\u00b5s", "10\u03bcs", "7ns", "0.1ns", "1.000000001s", "9223372036854775807ns",
              "2562047h", "2562047h47m16.854775807s", "9999999999999999h", "-1s", "5d", "NaNs"]:
        put("duration", s)


def probes_seeds():
    put("probes", json.dumps({
        "/app-health/web/livez": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP",
                                              "httpHeaders": [{"name": "X-A", "value": "b"}]},
                                  "timeoutSeconds": 2},
        "/app-health/web/readyz": {"tcpSocket": {"port": "8081"}},
        "/app-health/web/startupz": {"grpc": {"port": 9090, "service": "health"}},
        "/app-lifecycle/web/prestop": {"httpGet": {"path": "/stop", "port": 8080, "scheme": "HTTPS"}},
    }))
    put("probes", '{"/app-health/a/livez":{"httpGet":{"port":15020}}}')
    put("probes", '{"/x":{"tcpSocket":{"port":1}}}')


def sds_seeds():
    a, o = "/tmp/mesh-fuzz-sds/allowed", "/tmp/mesh-fuzz-sds/outside"
    put("sds_names", "default\nROOTCA")
    put("sds_names", f"file-cert:{a}/cert.pem~{a}/key.pem\nfile-root:{a}/root.pem")
    put("sds_names", f"file-root:{o}/root.pem\nfile-root:{a}/../outside/root.pem\nfile-root:{a}/escape/root.pem")
    put("sds_names", "file-root:system\nfile-cert:nope\nkubernetes://x\n")


PROXY_CONFIG = json.dumps({
    "drainDuration": "45s", "terminationDrainDuration": "5s", "concurrency": 2,
    "discoveryAddress": "istiod.istio-system.svc:15012",
    "proxyMetadata": {"ISTIO_META_DNS_CAPTURE": "true", "ISTIO_META_CLUSTER_ID": "c1"},
    "holdApplicationUntilProxyStarts": True, "statusPort": 15020,
})


def agent_seeds():
    base = ["POD_NAME=productpage-1", "POD_NAMESPACE=default", "INSTANCE_IP=10.1.0.11",
            "SERVICE_ACCOUNT=bookinfo", "ISTIO_META_CLUSTER_ID=Kubernetes"]
    put("agent_config", "\0".join(base))
    put("agent_config", "\0".join(base + [
        f"PROXY_CONFIG={PROXY_CONFIG}", "@remote=",
        "ISTIO_KUBE_APP_PROBERS={\"/app-health/web/livez\":{\"httpGet\":{\"path\":\"/\",\"port\":8080}}}",
        "ISTIO_METAJSON_LABELS={\"app\":\"productpage\"}", "DNS_FORWARD_TIMEOUT=2s",
        "MINIMUM_DRAIN_DURATION=5s", "SECRET_TTL=24h", "SECRET_GRACE_PERIOD_RATIO=0.5",
        "ISTIO_DELTA_XDS=false", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "ISTIO_CPU_LIMIT=2",
        "XDS_HEADER_authorization=Bearer x", "CA_ADDR=istiod.istio-system.svc:15012",
        "ECC_SIGNATURE_ALGORITHM=ECDSA", "ISTIO_PROMETHEUS_ANNOTATIONS={\"scrape\":\"true\",\"port\":\"9080\",\"path\":\"/metrics\"}",
    ]))
    put("agent_config", "\0".join(base + [
        "@labels=app=\"productpage\"\nversion=\"v1\"\ntopology.istio.io/locality=\"r/z/s\"",
        "@annotations=proxy.istio.io/config=\"{\\\"drainDuration\\\": \\\"9999999999999999h\\\"}\"",
        "@mesh=defaultConfig:\n  drainDuration: 10s\n  proxyStatsMatcher: {inclusionPrefixes: [a]}\n",
        "PILOT_DEBOUNCE_AFTER=100ms", "PILOT_DEBOUNCE_MAX=1s", "DNS_PROXY_ADDR=127.0.0.1:15053",
    ]))


def init_seeds():
    cases = [
        (["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "",
          "-b", "*", "-d", "15090,15021,15020"], []),
        (["-p", "15001", "-z", "15006", "-u", "1337", "-g", "1337", "-m", "TPROXY", "-i",
          "10.0.0.0/8,fd00::/8", "-x", "10.1.0.0/16", "-b", "8080,9090", "-q", "443",
          "-o", "22", "-c", "eth1", "-k", "net1", "-t", "1337", "-r", "133",
          "--redirect-dns", "--capture-all-dns", "--dual-stack", "--drop-invalid"], []),
        ([], ["INBOUND_CAPTURE_PORT=16000", "ISTIO_INBOUND_PORTS=*", "ISTIO_SERVICE_CIDR=*",
              "ISTIO_LOCAL_EXCLUDE_PORTS=15020", "REDIRECT_DNS=true", "PROXY_UID=1337,0",
              "ISTIO_META_DNS_CAPTURE=true", "ISTIO_INBOUND_INTERCEPTION_MODE=TPROXY",
              "INBOUND_TPROXY_MARK=1337", "ISTIO_EXCLUDE_INTERFACES=lo2"]),
        (["-c=-j ACCEPT"], []),
        (["--probe-timeout", "5s", "--iptables-probe-port", "15002", "--run-validation"], []),
    ]
    for words, env in cases:
        put("init_args", "\0".join(words) + "\x01" + "\0".join(env))


# --- recorded istiod responses --------------------------------------------------------------------

RECORDED = ROOT / "tests" / "fixtures" / "istiod-1.31" / "bookinfo-productpage"


def xds_adapt_seeds():
    # What a real istiod sent a sidecar (scripts/record-istiod.sh): the target's first byte says
    # Delta (1) or state of the world (0), the rest is the response as recorded.
    for flag, stream in ((b"\0", "sotw"), (b"\1", "delta")):
        for f in sorted((RECORDED / stream).glob("*.pb")):
            put("xds_adapt", flag + f.read_bytes())


# --- the proxy module's peer metadata (Istio's wire formats) ----------------------------------

def pb_value(v):
    if isinstance(v, dict):
        return field(5, pb_struct(v))
    return field(3, v)


def pb_struct(d):
    return b"".join(field(1, field(1, k) + field(2, pb_value(v))) for k, v in sorted(d.items()))


PRODUCTPAGE = {
    "NAME": "productpage-v1-b9879c6d-f9xbg",
    "NAMESPACE": "default",
    "WORKLOAD_NAME": "productpage-v1",
    "CLUSTER_ID": "Kubernetes",
    "OWNER": "kubernetes://apis/apps/v1/namespaces/default/deployments/productpage-v1",
    "LABELS": {
        "app": "productpage",
        "version": "v1",
        "service.istio.io/canonical-name": "productpage",
        "service.istio.io/canonical-revision": "v1",
    },
}


def peer_frame(meta, node_id, declared=None):
    body = pb_struct({"x-envoy-peer-metadata": meta, "x-envoy-peer-metadata-id": node_id})
    any_ = field(1, "type.googleapis.com/google.protobuf.Struct") + field(2, body)
    n = len(any_) if declared is None else declared
    return struct.pack(">II", 0x3D230467, n) + any_


def peer_metadata_seeds():
    import base64
    node_id = "sidecar~10.1.0.11~productpage-v1-b9879c6d-f9xbg.default~default.svc.cluster.local"
    header = base64.b64encode(pb_struct(PRODUCTPAGE)).decode()
    put("peer_metadata", b"\x01" + header.encode())
    put("peer_metadata", b"\x01" + header.rstrip("=").encode())  # padding left out
    put("peer_metadata", b"\x01" + b"not base64!")
    frame = peer_frame(PRODUCTPAGE, node_id)
    put("peer_metadata", b"\x00" + frame)
    put("peer_metadata", b"\x00" + frame + b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")  # the stream after it
    put("peer_metadata", b"\x00" + frame[:11])  # cut short
    put("peer_metadata", b"\x00" + peer_frame(PRODUCTPAGE, node_id, declared=1 << 20))  # past the bound
    put("peer_metadata", b"\x00" + b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1")  # a TLS hello


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", action="append", default=[],
                    help="a directory of text files with YAML examples for config_store")
    args = ap.parse_args()
    config_seeds(args.extra)
    duration_seeds()
    xds_seeds()
    dns_seeds()
    csr_seeds()
    probes_seeds()
    sds_seeds()
    agent_seeds()
    init_seeds()
    xds_adapt_seeds()
    peer_metadata_seeds()
    for d in sorted(OUT.iterdir()):
        print(f"seeds: {d.name}: {len(list(d.iterdir()))}")


if __name__ == "__main__":
    main()
