// The upstream suite, unmodified: every flag (-gateway-class, -conformance-profiles, ...) is the
// suite's own.
package gatewayconformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) { conformance.RunConformance(t) }
