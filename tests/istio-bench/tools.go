//go:build tools

// Package tools pins the package whose test binary scripts/bench-generation-istio.sh builds
// (`go test -c istio.io/istio/pilot/pkg/xds`): nothing here is our code but the blank import.
package tools

import _ "istio.io/istio/pilot/pkg/xds"
