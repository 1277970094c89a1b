#!/usr/bin/env python3
"""The benchmarks' mesh: N ServiceEntries in namespace `load`, each with a VIP, an HTTP port 8080, a TCP
port 9090 and E endpoints. apiVersion, `resolution: STATIC` (Istio's CRD refuses endpoints under its
default NONE) and `location: MESH_INTERNAL` (Istio's default is MESH_EXTERNAL) are written out, so the
same file means the same to istiod (through the API server) and istiod-core.
With --kube: N Kubernetes Services in `load` instead (selector app=svcI, one port `http` 80 -> 8080),
each with E Pods (labels app=svcI, version=v1; service account bench-app; node bench-node), a Pod's
address its `status: {podIP: ...}` (written once: bench-control-plane.sh's apply.py sets the rest of
the status and writes the EndpointSlices). The Pod spec is xds-load's KUBE_POD_SPEC.
Endpoint addresses go from 10.200.0.0 on in both shapes (xds-load moves 10.200.0.0).
Usage: gen-mesh.py FILE SERVICES ENDPOINTS_PER_SERVICE [--kube]"""
import sys
path, n, e = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kube = sys.argv[4:] == ["--kube"]
POD_SPEC = ("{nodeName: bench-node, serviceAccountName: bench-app, automountServiceAccountToken: false, "
            "containers: [{name: app, image: bench/app:1, ports: [{name: http, containerPort: 8080}]}]}")
def ip(k):
    return f"10.{200 + k // 65536}.{(k // 256) % 256}.{k % 256}"
with open(path, "w") as f:
    k = 0
    for i in range(n):
        if kube:
            for j in range(e):
                f.write(f"""---
apiVersion: v1
kind: Pod
metadata: {{name: svc{i}-{j}, namespace: load, labels: {{app: svc{i}, version: v1}}}}
spec: {POD_SPEC}
status: {{podIP: {ip(k)}}}
""")
                k += 1
            f.write(f"""---
apiVersion: v1
kind: Service
metadata: {{name: svc{i}, namespace: load}}
spec: {{selector: {{app: svc{i}}}, ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}
""")
            continue
        eps = []
        for _ in range(e):
            eps.append(f"{{address: {ip(k)}}}")
            k += 1
        f.write(f"""---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: svc{i}, namespace: load}}
spec:
  hosts: [svc{i}.load.svc.cluster.local]
  addresses: [10.{100 + i // 65536}.{(i // 256) % 256}.{i % 256}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8080, name: http, protocol: HTTP}}, {{number: 9090, name: tcp, protocol: TCP}}]
  endpoints: [{", ".join(eps)}]
""")
