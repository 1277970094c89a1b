#!/usr/bin/env python3
"""The benchmarks' mesh: N ServiceEntries in namespace `load`, each with a VIP, an HTTP port 8080, a TCP
port 9090 and E endpoints. apiVersion, `resolution: STATIC` (Istio's CRD refuses endpoints under its
default NONE) and `location: MESH_INTERNAL` (Istio's default is MESH_EXTERNAL) are written out, so the
same file means the same to istiod (through the API server) and istiod-core.
Usage: gen-mesh.py FILE SERVICES ENDPOINTS_PER_SERVICE"""
import sys
path, n, e = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "w") as f:
    k = 0
    for i in range(n):
        eps = []
        for _ in range(e):
            eps.append(f"{{address: 10.{200 + k // 65536}.{(k // 256) % 256}.{k % 256}}}")
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
