//! A Kubernetes cluster for tests, built from real components: etcd, kube-apiserver and
//! kube-controller-manager (`scripts/install-kube.sh`), a Node, and a test kubelet that runs the
//! Pods bound to that Node as network namespaces ([`kubelet`]); Istio's istiod with its sidecar
//! injector as Istio's users install it ([`istio`]), or istiod-core in istiod's place with Istio's
//! injector run offline ([`istiod_core`]); Bookinfo and the checks run against either ([`bookinfo`]).
//!
//! The cluster lives in a network namespace of its own, the node's host network: the control
//! plane listens on its loopback, pods hang off its bridge (`10.244.0.0/24`, the node at
//! `10.244.0.1`), and nothing there routes anywhere else. The thread that starts a cluster, and
//! every thread of its runtime, joins that namespace (see [`Cluster::start`]).

pub mod apply;
pub mod bookinfo;
pub mod cluster;
pub mod gateway_api;
pub mod http;
pub mod images;
pub mod installs;
pub mod istio;
pub mod istioctl;
pub mod istiod_core;
pub mod kubelet;
pub mod node;
pub mod standard_metrics;
pub mod vm;

pub use cluster::Cluster;
