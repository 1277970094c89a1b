#!/usr/bin/env python3
"""The parts of scripts/record-istiod.sh that handle Kubernetes objects (python3 standard library
only; YAML is read through `kubectl create --dry-run=client -o json`, which needs no PyYAML):

  control-plane MANIFEST_JSON OUT_DIR
      From `istioctl manifest generate` (as JSON): the objects a default install puts in the API
      server that matter to istiod without a gateway (CRDs, namespace, service accounts, the
      `istio` mesh ConfigMap, the injector's ConfigMaps, the `istiod` Service), written to
      OUT_DIR/control-plane.json, and the injector's files for `istioctl kube-inject`
      (OUT_DIR/{mesh.yaml,inject-config.yaml,inject-values.json}).
  run-pods KUBECTL KUBECONFIG NAMESPACE NODE NODE_IP IPS_JSON COUNT TIMEOUT_S
      What a kubelet would do for this recording, until COUNT pods are Ready: binds each pending
      pod of NAMESPACE to NODE (no scheduler runs) and writes its status (Running, Ready, the pod
      IP IPS_JSON gives for its `app-version` labels). Prints `pod NAME IP`.
  proxy-node PILOT_AGENT BOOTSTRAP_TMPL POD_JSON WORK_DIR OUT
      Runs Istio's own pilot-agent as the pod's injected `istio-proxy` container would be run
      (its env with the downward API resolved, its args, the pod's labels and annotations files)
      with Envoy replaced by a script that keeps the bootstrap, and writes the bootstrap's `node`
      (what that sidecar's Envoy sends istiod) to OUT, with PROXY_CONFIG.binaryPath and
      ISTIO_VERSION as a 1.31 release's injected sidecar has them.
"""

import json
import math
import pathlib
import re
import subprocess
import sys
import time


def control_plane(manifest, out):
    out = pathlib.Path(out)
    # kubectl writes one JSON document per object, one after another.
    text, items, at = open(manifest).read(), [], 0
    decoder = json.JSONDecoder()
    while at < len(text.rstrip()):
        doc, at = decoder.raw_decode(text, at)
        items.extend(doc.get("items", [doc]))
        while at < len(text) and text[at].isspace():
            at += 1
    keep = []
    for o in items:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind == "CustomResourceDefinition" or kind == "ServiceAccount":
            keep.append(o)
        elif kind == "ConfigMap" and name in ("istio", "istio-sidecar-injector", "values"):
            keep.append(o)
            data = o.get("data", {})
            if name == "istio":
                (out / "mesh.yaml").write_text(data["mesh"])
            elif name == "istio-sidecar-injector":
                (out / "inject-config.yaml").write_text(data["config"])
                (out / "inject-values.json").write_text(data["values"])
        elif kind == "Service" and name == "istiod":
            keep.append(o)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}
    doc = {"apiVersion": "v1", "kind": "List", "items": [namespace] + keep}
    (out / "control-plane.json").write_text(json.dumps(doc, indent=1))
    for o in keep:
        print(o["kind"], o["metadata"]["name"])


def kubectl(base, *args, stdin=None):
    return subprocess.run(base + list(args), input=stdin, check=True, capture_output=True, text=True).stdout


def container_statuses(containers, started, ready):
    return [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": ready(c),
            "restartCount": 0,
            "started": True,
            "state": started(c),
        }
        for c in containers
    ]


def run_pods(kubectl_bin, kubeconfig, namespace, node, node_ip, ips_json, count, timeout):
    base = [kubectl_bin, "--kubeconfig", kubeconfig, "-n", namespace]
    ips = json.loads(ips_json)
    count, deadline = int(count), time.monotonic() + float(timeout)
    done = {}
    while True:
        pods = json.loads(kubectl(base, "get", "pods", "-o", "json"))["items"]
        for p in pods:
            name = p["metadata"]["name"]
            if name in done or p["metadata"].get("deletionTimestamp"):
                continue
            labels = p["metadata"].get("labels", {})
            key = f'{labels.get("app")}-{labels.get("version")}'
            if key not in ips:
                sys.exit(f"record-istiod: pod {name}: no address for {key} in {ips_json}")
            if not p["spec"].get("nodeName"):
                binding = {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                }
                kubectl(base, "create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                        "-f", "-", stdin=json.dumps(binding))
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            running = {"running": {"startedAt": now}}
            exited = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
            # An init container with restartPolicy Always is a native sidecar: it keeps running.
            native = lambda c: c.get("restartPolicy") == "Always"
            status = {
                "status": {
                    "phase": "Running",
                    "hostIP": node_ip,
                    "hostIPs": [{"ip": node_ip}],
                    "podIP": ips[key],
                    "podIPs": [{"ip": ips[key]}],
                    "startTime": now,
                    "conditions": [
                        {"type": t, "status": "True", "lastTransitionTime": now}
                        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
                    ],
                    "initContainerStatuses": container_statuses(
                        p["spec"].get("initContainers", []),
                        lambda c: running if native(c) else exited,
                        native,
                    ),
                    "containerStatuses": container_statuses(
                        p["spec"]["containers"], lambda c: running, lambda c: True
                    ),
                }
            }
            kubectl(base, "patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))
            done[name] = ips[key]
            print("pod", name, ips[key], flush=True)
        if len(done) >= count:
            return
        if time.monotonic() > deadline:
            sys.exit(f"record-istiod: {len(done)} of {count} pods running after {timeout} s: {sorted(done)}")
        time.sleep(0.5)


def downward(pairs):
    # The kubelet's format for downward-API label/annotation files: sorted, Go-quoted values.
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(pairs.items()))


def field_ref(pod, path):
    values = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "status.podIP": pod["status"].get("podIP", ""),
        "status.hostIP": pod["status"].get("hostIP", ""),
    }
    if path not in values:
        sys.exit(f"record-istiod: fieldRef {path} is not resolved here")
    return values[path]


def quantity(q, divisor):
    # Enough of Kubernetes' quantities for CPU and memory limits: plain, m, Ki..Gi, k..G.
    units = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    def value(s):
        m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(s))
        if not m or m.group(2) not in units:
            sys.exit(f"record-istiod: quantity {s} is not understood")
        return float(m.group(1)) * units[m.group(2)]
    return str(math.ceil(value(q) / value(divisor or "1")))


def proxy_node(pilot_agent, template, pod_json, work, out):
    pod = json.load(open(pod_json))
    spec = pod["spec"]
    proxy = next(
        (c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "istio-proxy"), None
    )
    if proxy is None:
        sys.exit("record-istiod: the pod has no istio-proxy container (not injected?)")
    work = pathlib.Path(work)
    (work / "etc/istio/pod").mkdir(parents=True, exist_ok=True)
    (work / "out").mkdir(exist_ok=True)
    (work / "etc/istio/pod/labels").write_text(downward(pod["metadata"].get("labels", {})))
    (work / "etc/istio/pod/annotations").write_text(downward(pod["metadata"].get("annotations", {})))
    fake = work / "fake-envoy"
    fake.write_text('#!/bin/sh\ncp "$2" "$OUT/envoy-rev.json"\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    for e in proxy.get("env", []):
        if "value" in e:
            v = e["value"]
        elif "fieldRef" in e.get("valueFrom", {}):
            v = field_ref(pod, e["valueFrom"]["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in e.get("valueFrom", {}):
            r = e["valueFrom"]["resourceFieldRef"]
            limit = proxy.get("resources", {}).get("limits", {}).get(r["resource"].split(".", 1)[1])
            v = quantity(limit, r.get("divisor")) if limit else "0"
        else:
            continue
        env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), v)
    proxy_config = json.loads(env.get("PROXY_CONFIG", "{}"))
    proxy_config["binaryPath"] = str(fake)
    env.update(
        {
            "PROXY_CONFIG": json.dumps(proxy_config),
            "OUT": str(work / "out"),
            "ISTIO_BOOTSTRAP": template,
            # No cloud metadata lookups; no root certificate needed before Envoy starts.
            "CLOUD_PLATFORM": "none",
            "CA_ROOT_CA": "SYSTEM",
            "XDS_ROOT_CA": "SYSTEM",
        }
    )
    args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in proxy.get("args", [])]
    run = subprocess.run([pilot_agent] + args, cwd=work, env=env, capture_output=True, text=True, timeout=60)
    bootstrap = work / "out/envoy-rev.json"
    if not bootstrap.exists():
        sys.exit(f"record-istiod: Istio's pilot-agent wrote no bootstrap (exit {run.returncode}):\n{run.stdout}{run.stderr}")
    node = json.load(open(bootstrap))["node"]
    # Two values of this run, not of a sidecar: the Envoy binary (the fake; the injected
    # container's is ProxyConfig's default) and the version of this branch build (`1.31-<commit>`;
    # a 1.31 release's proxy sends `1.31.N`).
    node["metadata"]["PROXY_CONFIG"]["binaryPath"] = "/usr/local/bin/envoy"
    node["metadata"]["ISTIO_VERSION"] = "1.31.0"
    pathlib.Path(out).write_text(json.dumps(node, indent=2, sort_keys=True) + "\n")
    print("node", node["id"])


if __name__ == "__main__":
    commands = {"control-plane": control_plane, "run-pods": run_pods, "proxy-node": proxy_node}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
