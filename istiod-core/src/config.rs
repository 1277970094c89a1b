//! The configuration of `istiod-core serve`, parsed once at the edge: the flags (`ServeArgs`)
//! and the environment (`PilotEnv`), together a typed `ServeConfig`. Every environment variable
//! istiod-core reads is named in `env`; parsing takes a lookup function, so tests pass a map and
//! never touch the process environment. The names and meanings are istiod's (`pilot/pkg/features`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The environment variables istiod-core reads, by name.
pub mod env {
    /// Quiet period after a config change before it is pushed (Go duration, 100ms).
    pub const PILOT_DEBOUNCE_AFTER: &str = "PILOT_DEBOUNCE_AFTER";
    /// Longest a change waits for quiet (Go duration, 10s).
    pub const PILOT_DEBOUNCE_MAX: &str = "PILOT_DEBOUNCE_MAX";
    /// Streams that generate a push at once (0 or unset: `min(15 + 5 × cores, 100)`).
    pub const PILOT_PUSH_THROTTLE: &str = "PILOT_PUSH_THROTTLE";
    /// How long an auto-registered WorkloadEntry outlives its proxy's last stream (10s).
    pub const PILOT_WORKLOAD_ENTRY_GRACE_PERIOD: &str = "PILOT_WORKLOAD_ENTRY_GRACE_PERIOD";
    /// `true`: a Gateway selects routers of its own namespace only.
    pub const PILOT_SCOPE_GATEWAY_TO_NAMESPACE: &str = "PILOT_SCOPE_GATEWAY_TO_NAMESPACE";
    /// `true`: every cached resource is generated again on read and compared (`GenCache`).
    pub const ISTIOD_CACHE_CHECK: &str = "ISTIOD_CACHE_CHECK";
    /// The namespace istiod runs in (its Deployment's downward API): where the mesh ConfigMap
    /// and the CA's Secrets are (istio-system).
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    /// The control plane's revision: its mesh ConfigMap is `istio-<REVISION>` unless `default`.
    pub const REVISION: &str = "REVISION";
    /// `true`: write config status on Istio's objects (Kubernetes source only), one replica at a
    /// time (the Lease `istio-status-leader`).
    pub const PILOT_ENABLE_STATUS: &str = "PILOT_ENABLE_STATUS";
    /// This replica's name (its Deployment's downward API): its identity in leader election.
    pub const POD_NAME: &str = "POD_NAME";
    /// The cluster this control plane's registry reads (istiod's `CLUSTER_ID`, default
    /// `Kubernetes`): endpoints' `topology.istio.io/cluster` and shards in `/debug/endpointz`.
    pub const CLUSTER_ID: &str = "CLUSTER_ID";
    /// `false`: address-less ServiceEntry hosts get no addresses of their own (DNS
    /// auto-allocation, on by default as in Istio since 1.25).
    pub const PILOT_ENABLE_IP_AUTOALLOCATE: &str = "PILOT_ENABLE_IP_AUTOALLOCATE";
    /// `false`: do not deploy Gateway API Gateways (ServiceAccount, Deployment, Service per
    /// Gateway; Kubernetes source only). Default `true`.
    pub const PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER: &str =
        "PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER";
    /// The proxy image of deployed Gateways when the injector's ConfigMap
    /// (`istio-sidecar-injector`) is missing (istio-rs only; Istio has no such fallback).
    pub const ISTIO_RS_PROXY_IMAGE: &str = "ISTIO_RS_PROXY_IMAGE";
}

/// istiod's namespace when `POD_NAMESPACE` is unset.
pub const DEFAULT_POD_NAMESPACE: &str = "istio-system";

/// The DNS domain of the cluster's services (`--domain-suffix`).
pub const DEFAULT_DOMAIN_SUFFIX: &str = "cluster.local";

/// istiod's `CLUSTER_ID` when none is set: the cluster istiod runs in.
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";

/// Istio's PILOT_WORKLOAD_ENTRY_GRACE_PERIOD default.
pub const DEFAULT_WORKLOAD_ENTRY_GRACE: Duration = Duration::from_secs(10);

/// Concurrent ADS streams accepted before new ones are refused (RESOURCE_EXHAUSTED).
pub const DEFAULT_MAX_STREAMS: usize = 100_000;

/// Istio's PILOT_PUSH_THROTTLE when left at 0 (auto): `min(15 + 5 × cores, 100)`.
pub fn default_push_throttle() -> usize {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (15 + 5 * cores).min(100)
}

/// Istio's push debounce: a change is acted on once no other has come for `after`
/// (PILOT_DEBOUNCE_AFTER, 100ms), or `max` after the first (PILOT_DEBOUNCE_MAX, 10s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debounce {
    pub after: Duration,
    pub max: Duration,
}

impl Default for Debounce {
    fn default() -> Self {
        Debounce {
            after: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

impl Debounce {
    /// Called after a first event: returns once `after` passes with no new event, or `max`
    /// after the call; false if the event source closed.
    pub async fn settle(&self, events: &mut tokio::sync::mpsc::Receiver<()>) -> bool {
        let deadline = tokio::time::Instant::now() + self.max;
        loop {
            let quiet = tokio::time::Instant::now() + self.after;
            tokio::select! {
                ev = events.recv() => {
                    if ev.is_none() {
                        return false;
                    }
                }
                _ = tokio::time::sleep_until(quiet.min(deadline)) => return true,
            }
            if tokio::time::Instant::now() >= deadline {
                return true;
            }
        }
    }
}

/// How the environment is read: a variable's value by name.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment, as a `Lookup` (for `main` and for constructors that are given no
/// settings).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// An environment variable whose value is not what it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: expected {expected}")]
pub struct EnvError {
    pub name: &'static str,
    pub value: String,
    pub expected: String,
}

/// A Go duration (`10s`, `1m30s`) from `name`, if set (and not blank, when `skip_blank`);
/// `example` is what the error suggests.
fn duration(
    lookup: Lookup,
    name: &'static str,
    example: &str,
    skip_blank: bool,
) -> Result<Option<Duration>, EnvError> {
    let Some(value) = lookup(name).filter(|v| !skip_blank || !v.trim().is_empty()) else {
        return Ok(None);
    };
    match mesh_common::parse_go_duration(&value) {
        Ok(d) => Ok(Some(d)),
        Err(e) => Err(EnvError {
            name,
            expected: format!("a duration such as {example} ({e})"),
            value,
        }),
    }
}

/// A boolean as istiod reads it (`strconv.ParseBool`); unset or empty is false. istiod warns and
/// uses the default on any other value; here it is an error naming the variable.
fn flag(lookup: Lookup, name: &'static str) -> Result<bool, EnvError> {
    match lookup(name) {
        None => Ok(false),
        Some(value) if value.is_empty() => Ok(false),
        Some(value) => mesh_common::parse_go_bool(&value).ok_or_else(|| EnvError {
            name,
            expected: format!("a boolean: {}", mesh_common::GO_BOOL_VALUES),
            value,
        }),
    }
}

/// A boolean as `flag` reads it, `default` when unset or empty.
fn flag_or(lookup: Lookup, name: &'static str, default: bool) -> Result<bool, EnvError> {
    match lookup(name) {
        None => Ok(default),
        Some(value) if value.is_empty() => Ok(default),
        Some(_) => flag(lookup, name),
    }
}

/// PILOT_DEBOUNCE_AFTER and PILOT_DEBOUNCE_MAX (blank: the default).
pub fn debounce(lookup: Lookup) -> Result<Debounce, EnvError> {
    let mut d = Debounce::default();
    for (name, field) in [
        (env::PILOT_DEBOUNCE_AFTER, &mut d.after),
        (env::PILOT_DEBOUNCE_MAX, &mut d.max),
    ] {
        if let Some(value) = duration(lookup, name, "100ms or 10s", true)? {
            *field = value;
        }
    }
    Ok(d)
}

/// PILOT_SCOPE_GATEWAY_TO_NAMESPACE.
pub fn scope_gateway_to_namespace(lookup: Lookup) -> Result<bool, EnvError> {
    flag(lookup, env::PILOT_SCOPE_GATEWAY_TO_NAMESPACE)
}

/// ISTIOD_CACHE_CHECK.
pub fn cache_check(lookup: Lookup) -> Result<bool, EnvError> {
    flag(lookup, env::ISTIOD_CACHE_CHECK)
}

/// What istiod-core takes from its environment (`env`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PilotEnv {
    pub debounce: Debounce,
    /// Streams generating at once (already resolved from 0/unset to the default).
    pub push_throttle: usize,
    pub workload_entry_grace: Duration,
    pub scope_gateway_to_namespace: bool,
    pub cache_check: bool,
    /// `POD_NAMESPACE`, else `istio-system`: where the mesh ConfigMap, the CA's Secrets and
    /// the status Lease are.
    pub pod_namespace: String,
    /// The mesh ConfigMap's name: `istio`, or `istio-<REVISION>`.
    pub mesh_config_map: String,
    /// PILOT_ENABLE_STATUS.
    pub enable_status: bool,
    /// POD_NAME (unset: the host name and process id stand for it).
    pub pod_name: Option<String>,
    /// PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER (default true).
    pub gateway_deployment: bool,
    /// The injector's ConfigMap in `pod_namespace` (`istio-sidecar-injector`, or
    /// `istio-sidecar-injector-<REVISION>`): the deployed Gateways' proxy image and settings.
    pub injector_config_map: String,
    /// ISTIO_RS_PROXY_IMAGE.
    pub proxy_image: Option<String>,
    /// CLUSTER_ID, else `Kubernetes`.
    pub cluster_id: String,
    /// PILOT_ENABLE_IP_AUTOALLOCATE, default true.
    pub auto_allocate: bool,
}

impl PilotEnv {
    pub fn from_lookup(lookup: Lookup) -> Result<PilotEnv, EnvError> {
        let push_throttle = match lookup(env::PILOT_PUSH_THROTTLE) {
            None => None,
            Some(value) => match value.trim().parse::<usize>() {
                Ok(n) => Some(n),
                Err(_) => {
                    return Err(EnvError {
                        name: env::PILOT_PUSH_THROTTLE,
                        value,
                        expected: "a whole number".into(),
                    });
                }
            },
        };
        Ok(PilotEnv {
            debounce: debounce(lookup)?,
            push_throttle: push_throttle
                .filter(|n| *n > 0)
                .unwrap_or_else(default_push_throttle),
            workload_entry_grace: duration(
                lookup,
                env::PILOT_WORKLOAD_ENTRY_GRACE_PERIOD,
                "10s",
                false,
            )?
            .unwrap_or(DEFAULT_WORKLOAD_ENTRY_GRACE),
            scope_gateway_to_namespace: scope_gateway_to_namespace(lookup)?,
            cache_check: cache_check(lookup)?,
            pod_namespace: lookup(env::POD_NAMESPACE)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| DEFAULT_POD_NAMESPACE.to_string()),
            mesh_config_map: match lookup(env::REVISION).as_deref() {
                None | Some("") | Some("default") => "istio".into(),
                Some(rev) => format!("istio-{rev}"),
            },
            enable_status: flag(lookup, env::PILOT_ENABLE_STATUS)?,
            pod_name: lookup(env::POD_NAME).filter(|v| !v.is_empty()),
            cluster_id: lookup(env::CLUSTER_ID)
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_CLUSTER_ID.into()),
            auto_allocate: flag_or(lookup, env::PILOT_ENABLE_IP_AUTOALLOCATE, true)?,
            gateway_deployment: flag_or(
                lookup,
                env::PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER,
                true,
            )?,
            injector_config_map: match lookup(env::REVISION).as_deref() {
                None | Some("") | Some("default") => "istio-sidecar-injector".into(),
                Some(rev) => format!("istio-sidecar-injector-{rev}"),
            },
            proxy_image: lookup(env::ISTIO_RS_PROXY_IMAGE)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty()),
        })
    }
}

/// The flags of `istiod-core serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Directory of Kubernetes-style YAML/JSON (ServiceEntry, WorkloadEntry, Service, Endpoints, ...).
    /// Required unless config comes from Kubernetes (--kubeconfig or in-cluster); with both, the
    /// directory's config adds to the cluster's.
    #[arg(long = "config-dir", required_unless_present_any = ["kubeconfig", "in_cluster"])]
    pub config_dir: Option<PathBuf>,
    /// Take config and the service registry from this Kubernetes API server (kubeconfig file;
    /// istiod's --kubeconfig): Services, EndpointSlices, Pods, Nodes, Namespaces, the mesh
    /// ConfigMap and Istio's CRDs, watched.
    #[arg(long = "kubeconfig", conflicts_with = "in_cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// Take config from the Kubernetes API server this process runs in (the pod's service
    /// account: KUBERNETES_SERVICE_HOST and the mounted token and CA).
    #[arg(long = "in-cluster")]
    pub in_cluster: bool,
    /// Address for the gRPC xDS server.
    #[arg(long = "grpc-addr", default_value = "127.0.0.1:15010")]
    pub grpc_addr: SocketAddr,
    /// DNS suffix of Kubernetes services.
    #[arg(long = "domain-suffix", default_value = DEFAULT_DOMAIN_SUFFIX)]
    pub domain_suffix: String,
    /// Serve TLS with this certificate chain (PEM); requires --tls-key.
    #[arg(long = "tls-cert", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long = "tls-key", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require `authorization: Bearer <contents of this file>` on every xDS stream.
    #[arg(long = "token-file")]
    pub token_file: Option<PathBuf>,
    /// Serve the CA (istio.v1.auth.IstioCertificateService) with the root kept in this
    /// directory (or Istio's cacerts files found there). Requires --jwt-public-key or
    /// --jwt-jwks, except with --kubeconfig or --in-cluster: there the CA is always served,
    /// tokens are checked by a TokenReview unless a --jwt-* flag is given, and without this
    /// flag the root is the cluster's (Secret `cacerts`, else `istio-ca-secret`, in
    /// POD_NAMESPACE), published to every namespace as ConfigMap istio-ca-root-cert. Unless --grpc-addr is on 15010 (Istio's plaintext port) or --tls-cert is
    /// given, gRPC is served over TLS with a certificate for istiod.istio-system.svc from
    /// this CA, and mesh client certificates also authenticate CA calls.
    #[arg(long = "ca-dir")]
    pub ca_dir: Option<PathBuf>,
    /// PEM public key (EC P-256 or RSA) that signs the service-account tokens the CA accepts.
    #[arg(
        long = "jwt-public-key",
        requires = "ca_dir",
        conflicts_with = "jwt_jwks"
    )]
    pub jwt_public_key: Option<PathBuf>,
    /// A JWKS file (EC P-256 / RSA keys) instead of --jwt-public-key.
    #[arg(long = "jwt-jwks", requires = "ca_dir")]
    pub jwt_jwks: Option<PathBuf>,
    /// Issuer the CA requires in those tokens.
    #[arg(
        long = "jwt-issuer",
        default_value = "https://kubernetes.default.svc.cluster.local"
    )]
    pub jwt_issuer: String,
    /// The mesh trust domain of issued identities [default: the mesh config's trustDomain,
    /// else cluster.local].
    #[arg(long = "trust-domain")]
    pub trust_domain: Option<String>,
    /// Mesh config file (MeshConfig YAML, as istiod's --meshConfig): rootNamespace,
    /// enableAutoMtls, outboundTrafficPolicy and trustDomain are acted on. Watched.
    #[arg(long = "mesh-config", alias = "meshConfig")]
    pub mesh_config: Option<PathBuf>,
    /// Longest certificate lifetime the CA issues, in seconds.
    #[arg(long = "max-cert-ttl", default_value_t = 7 * 24 * 3600)]
    pub max_cert_ttl: u64,
    /// Serve /debug/syncz, /debug/configz and /debug/registryz (JSON) on this address
    /// (istiod uses 15014).
    #[arg(long = "debug-addr")]
    pub debug_addr: Option<SocketAddr>,
    /// Refuse ADS streams beyond this many at once (RESOURCE_EXHAUSTED).
    #[arg(long = "max-streams", default_value_t = DEFAULT_MAX_STREAMS)]
    pub max_streams: usize,
    /// Connections to --grpc-addr held at once from non-loopback peers; loopback has 1024 more
    /// of its own. Lowered to fit the open-file limit (raised to its hard limit at start) less
    /// 256 descriptors kept for the config reload. Beyond it, a new connection takes the place
    /// of the oldest one that has not sent a request yet, or is closed if every one has.
    #[arg(long = "max-connections", default_value_t = 20_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    /// Connections to --grpc-addr from one peer address, as --max-connections.
    #[arg(long = "max-connections-per-peer", default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections_per_peer: usize,
    /// Time a new connection has to finish its TLS handshake and HTTP/2 preface and send its
    /// first request, a Go duration; then it is closed.
    #[arg(long = "handshake-timeout", default_value = "10s", value_parser = positive_duration)]
    pub handshake_timeout: Duration,
    /// HTTP/2 keepalive: a PING after this long without frames from the peer (istiod's
    /// --keepaliveInterval), a Go duration.
    #[arg(long = "keepalive-interval", alias = "keepaliveInterval", default_value = "30s", value_parser = positive_duration)]
    pub keepalive_interval: Duration,
    /// HTTP/2 keepalive: the connection is closed when a PING is not answered within this
    /// (istiod's --keepaliveTimeout), a Go duration.
    #[arg(long = "keepalive-timeout", alias = "keepaliveTimeout", default_value = "10s", value_parser = positive_duration)]
    pub keepalive_timeout: Duration,
    /// How long an xDS response may wait for its proxy to take it before the stream and its
    /// connection are closed (istiod's PILOT_XDS_SEND_TIMEOUT), a Go duration.
    #[arg(long = "send-timeout", default_value = "30s", value_parser = positive_duration)]
    pub send_timeout: Duration,
    /// After SIGTERM, how long the proxies' open streams may keep the server up before they are
    /// closed (Istio's --shutdownDuration), a Go duration.
    #[arg(
        long = "shutdown-duration",
        alias = "shutdownDuration",
        default_value = "10s",
        value_parser = go_duration
    )]
    pub shutdown_duration: Duration,
}

/// A flag's Go duration (`10s`, `1m30s`), checked.
fn go_duration(raw: &str) -> Result<Duration, String> {
    mesh_common::duration::parse_go_duration(raw).map_err(|e| e.to_string())
}

/// A flag's Go duration that must be more than zero.
fn positive_duration(raw: &str) -> Result<Duration, String> {
    match go_duration(raw)? {
        d if d.is_zero() => Err(format!("{raw:?}: must be more than 0s")),
        d => Ok(d),
    }
}

/// Everything `serve::serve` needs: the flags and the environment, parsed.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub args: ServeArgs,
    pub env: PilotEnv,
}

impl ServeConfig {
    pub fn new(args: ServeArgs, lookup: Lookup) -> Result<ServeConfig, EnvError> {
        Ok(ServeConfig {
            args,
            env: PilotEnv::from_lookup(lookup)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: std::collections::HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.get(k).cloned()
    }

    #[test]
    fn unset_environment_gives_istiods_defaults() {
        let got = PilotEnv::from_lookup(&env(&[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            got,
            PilotEnv {
                debounce: Debounce::default(),
                push_throttle: default_push_throttle(),
                workload_entry_grace: Duration::from_secs(10),
                scope_gateway_to_namespace: false,
                cache_check: false,
                pod_namespace: "istio-system".into(),
                mesh_config_map: "istio".into(),
                enable_status: false,
                pod_name: None,
                gateway_deployment: true,
                injector_config_map: "istio-sidecar-injector".into(),
                proxy_image: None,
                cluster_id: "Kubernetes".into(),
                auto_allocate: true,
            }
        );
    }

    #[test]
    fn each_variable_is_read() {
        let got = PilotEnv::from_lookup(&env(&[
            (env::PILOT_DEBOUNCE_AFTER, "50ms"),
            (env::PILOT_DEBOUNCE_MAX, " "),
            (env::PILOT_PUSH_THROTTLE, " 7 "),
            (env::PILOT_WORKLOAD_ENTRY_GRACE_PERIOD, "1m"),
            (env::PILOT_SCOPE_GATEWAY_TO_NAMESPACE, "TRUE"),
            (env::ISTIOD_CACHE_CHECK, "1"),
            (env::POD_NAMESPACE, "mesh-system"),
            (env::REVISION, "canary"),
            (env::PILOT_ENABLE_STATUS, "true"),
            (env::POD_NAME, "istiod-7f9c"),
            (env::PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER, "false"),
            (env::ISTIO_RS_PROXY_IMAGE, "registry.example/proxyv2:1.0"),
            (env::CLUSTER_ID, "east"),
            (env::PILOT_ENABLE_IP_AUTOALLOCATE, "false"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            got,
            PilotEnv {
                debounce: Debounce {
                    after: Duration::from_millis(50),
                    max: Duration::from_secs(10),
                },
                push_throttle: 7,
                workload_entry_grace: Duration::from_secs(60),
                scope_gateway_to_namespace: true,
                cache_check: true,
                pod_namespace: "mesh-system".into(),
                mesh_config_map: "istio-canary".into(),
                enable_status: true,
                pod_name: Some("istiod-7f9c".into()),
                gateway_deployment: false,
                injector_config_map: "istio-sidecar-injector-canary".into(),
                proxy_image: Some("registry.example/proxyv2:1.0".into()),
                cluster_id: "east".into(),
                auto_allocate: false,
            }
        );
        let zero = PilotEnv::from_lookup(&env(&[(env::PILOT_PUSH_THROTTLE, "0")]));
        assert_eq!(zero.map(|e| e.push_throttle), Ok(default_push_throttle()));
        // Go's spellings, and nothing else.
        let upper = PilotEnv::from_lookup(&env(&[(env::ISTIOD_CACHE_CHECK, "T")]));
        assert_eq!(upper.map(|e| e.cache_check), Ok(true));
        let off = PilotEnv::from_lookup(&env(&[(env::PILOT_SCOPE_GATEWAY_TO_NAMESPACE, "False")]));
        assert_eq!(off.map(|e| e.scope_gateway_to_namespace), Ok(false));
    }

    #[test]
    fn a_bad_value_names_the_variable_and_the_value() {
        for (name, value, expected) in [
            (env::PILOT_PUSH_THROTTLE, "many", "a whole number"),
            (
                env::PILOT_WORKLOAD_ENTRY_GRACE_PERIOD,
                "",
                "a duration such as 10s",
            ),
            (
                env::PILOT_DEBOUNCE_MAX,
                "soon",
                "a duration such as 100ms or 10s",
            ),
            (env::ISTIOD_CACHE_CHECK, "yes", "a boolean: 1, t, T"),
            (
                env::PILOT_SCOPE_GATEWAY_TO_NAMESPACE,
                "on",
                "a boolean: 1, t, T",
            ),
            (
                env::PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER,
                "off",
                "a boolean: 1, t, T",
            ),
        ] {
            let e = PilotEnv::from_lookup(&env(&[(name, value)]))
                .err()
                .unwrap_or_else(|| panic!("{name}={value:?} accepted"));
            assert_eq!((e.name, e.value.as_str()), (name, value));
            assert!(
                e.to_string()
                    .starts_with(&format!("{name}={value:?}: expected {expected}")),
                "{e}"
            );
        }
    }
}
