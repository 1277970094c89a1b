//! Env var names, as Istio spells them.

pub const POD_NAME: &str = "POD_NAME";
pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
/// The workload (Deployment) name the injector gives the proxy's metadata.
pub const WORKLOAD_NAME: &str = "ISTIO_META_WORKLOAD_NAME";
pub const INSTANCE_IP: &str = "INSTANCE_IP";
pub const SERVICE_ACCOUNT: &str = "SERVICE_ACCOUNT";
/// The pod's own OpenTelemetry resource attributes (kept in Envoy's, before its service name).
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
pub const PROXY_CONFIG: &str = "PROXY_CONFIG";
pub const ENVOY_USER: &str = "ENVOY_USER";
pub const ISTIO_META_PREFIX: &str = "ISTIO_META_";
pub const ISTIO_METAJSON_PREFIX: &str = "ISTIO_METAJSON_";
/// Capture DNS to the agent's DNS proxy (the proxy is started; istio-iptables redirects port 53).
pub const DNS_CAPTURE: &str = "ISTIO_META_DNS_CAPTURE";
/// Start the DNS proxy without capture (gateways).
pub const ENABLE_DNS_SERVER: &str = "ISTIO_META_ENABLE_DNS_SERVER";
pub const ISTIO_DELTA_XDS: &str = "ISTIO_DELTA_XDS";
pub const EXIT_ON_ZERO_ACTIVE_CONNECTIONS: &str = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS";
pub const MINIMUM_DRAIN_DURATION: &str = "MINIMUM_DRAIN_DURATION";
pub const ISTIO_CPU_LIMIT: &str = "ISTIO_CPU_LIMIT";
pub const ISTIO_BOOTSTRAP_OVERRIDE: &str = "ISTIO_BOOTSTRAP_OVERRIDE";
pub const ISTIO_BOOTSTRAP: &str = "ISTIO_BOOTSTRAP";
pub const ISTIO_KUBE_APP_PROBERS: &str = "ISTIO_KUBE_APP_PROBERS";
pub const ISTIO_PROMETHEUS_ANNOTATIONS: &str = "ISTIO_PROMETHEUS_ANNOTATIONS";
/// Istio 1.30: false leaves Envoy's metrics out of 15020's merged exposition.
pub const PILOT_AGENT_MERGE_ENVOY_STATS: &str = "PILOT_AGENT_MERGE_ENVOY_STATS";
pub const DNS_PROXY_ADDR: &str = "DNS_PROXY_ADDR";
pub const DNS_FORWARD_TIMEOUT: &str = "DNS_FORWARD_TIMEOUT";
pub const DNS_FORWARD_PARALLEL: &str = "DNS_FORWARD_PARALLEL";
pub const REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION: &str =
    "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION";
pub const XDS_ROOT_CA: &str = "XDS_ROOT_CA";
pub const ISTIOD_SAN: &str = "ISTIOD_SAN";
pub const PROV_CERT: &str = "PROV_CERT";
pub const XDS_HEADER_PREFIX: &str = "XDS_HEADER_";
/// Largest xDS response accepted from a remote control plane, in bytes (ours; Istio has no cap).
pub const XDS_MAX_RESPONSE_BYTES: &str = "XDS_MAX_RESPONSE_BYTES";
pub const CLUSTER_ID: &str = "ISTIO_META_CLUSTER_ID";
pub const TRUST_DOMAIN: &str = "TRUST_DOMAIN";
pub const CA_ADDR: &str = "CA_ADDR";
pub const CA_ROOT_CA: &str = "CA_ROOT_CA";
pub const CA_HEADER_PREFIX: &str = "CA_HEADER_";
pub const SECRET_TTL: &str = "SECRET_TTL";
pub const SECRET_GRACE_PERIOD_RATIO: &str = "SECRET_GRACE_PERIOD_RATIO";
pub const SECRET_GRACE_PERIOD_RATIO_JITTER: &str = "SECRET_GRACE_PERIOD_RATIO_JITTER";
pub const ECC_SIGNATURE_ALGORITHM: &str = "ECC_SIGNATURE_ALGORITHM";
pub const ECC_CURVE: &str = "ECC_CURVE";
pub const WORKLOAD_RSA_KEY_SIZE: &str = "WORKLOAD_RSA_KEY_SIZE";
pub const FILE_MOUNTED_CERTS: &str = "FILE_MOUNTED_CERTS";
pub const OUTPUT_CERTS: &str = "OUTPUT_CERTS";
/// Adapt a remote istiod's xDS for upstream Envoy (`xds_adapt`); default on for a remote
/// control plane, off for the embedded one.
pub const XDS_ADAPT: &str = "XDS_ADAPT";
