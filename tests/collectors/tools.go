//go:build tools

// Package collectors pins the commands scripts/install-collectors.sh builds.
package collectors

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
