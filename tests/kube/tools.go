//go:build tools

// Package tools pins the Kubernetes commands the tests build (scripts/install-kube.sh) to
// k8s.io/kubernetes v1.36.3: nothing here is our code, only the blank imports that make
// `go mod tidy` keep their dependencies in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
