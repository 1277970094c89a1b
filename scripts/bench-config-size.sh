#!/usr/bin/env bash
# Peak memory of `istiod-core serve` loading a large config directory, against the input's size
# (issue #29: a 50 MB ServiceEntry once cost 2.3 GB). Two inputs, written by gen-mesh.py's
# sibling below: one ServiceEntry with 1.9 M endpoints in one 53 MB document (refused before it
# is parsed: over the 4 MiB document limit), and 50 MB of 4444 ServiceEntries of 400 endpoints
# each (taken up to the 1 M endpoint limit of a directory, the rest refused by name).
#   ./scripts/bench-config-size.sh            # the release binary, built if missing
#   BIN=path/to/istiod-core ./scripts/bench-config-size.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-target/release/istiod-core}"
[ -x "$BIN" ] || cargo build --release -p istiod-core
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import os, sys
root = sys.argv[1]
def ep(i): return "{address: 10.%d.%d.%d}" % (i >> 16 & 255, i >> 8 & 255, i & 255)
os.makedirs(f"{root}/one-document"); os.makedirs(f"{root}/many-documents")
with open(f"{root}/one-document/se.yaml", "w") as f:
    f.write("kind: ServiceEntry\nmetadata: {name: big, namespace: ns}\nspec:\n  hosts: [big.example.com]\n"
            "  ports: [{number: 80, name: http}]\n  endpoints:\n")
    for i in range(1_900_000):
        f.write("  - " + ep(i) + "\n")
n, size = 0, 0
with open(f"{root}/many-documents/se.yaml", "w") as f:
    while size < 50_000_000:
        s = (f"---\nkind: ServiceEntry\nmetadata: {{name: s{n}, namespace: ns}}\nspec:\n  hosts: [s{n}.example.com]\n"
             "  ports: [{number: 80, name: http}]\n  endpoints:\n")
        s += "".join("  - " + ep(n * 400 + j) + "\n" for j in range(400))
        f.write(s); size += len(s); n += 1
PY
printf '%-16s %10s %12s %8s %s\n' input "input MB" "peak RSS MB" ratio "refused"
for case in one-document many-documents; do
  dir="$work/$case"
  bytes=$(du -b "$dir/se.yaml" | cut -f1)
  log="$work/$case.log"
  "$BIN" serve --config-dir "$dir" --grpc-addr 127.0.0.1:0 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "serving xDS" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  hwm=$(awk '/VmHWM/ {print $2}' /proc/$pid/status 2>/dev/null || echo 0)
  kill $pid 2>/dev/null; wait $pid 2>/dev/null || true
  refused=$(grep -c "refused" "$log" || true)
  awk -v c="$case" -v b="$bytes" -v h="$hwm" -v r="$refused" \
    'BEGIN { printf "%-16s %10.1f %12.1f %7.1fx %s\n", c, b/1e6, h*1024/1e6, h*1024/b, r }'
done
