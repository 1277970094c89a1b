//! The agent's typed configuration, parsed once at the edge from the flags and env vars Istio's
//! injector writes (`pilot/cmd/pilot-agent/options`, `pkg/config/mesh` ProxyConfig defaults).
//! Nothing deeper reads the environment.

pub mod embedded;
pub mod env;
pub mod features;
pub mod health;
pub mod identity;
pub mod inputs;
pub mod legacy_flags;
pub mod metrics;
pub mod ports;
pub mod probes;
mod proxy_config;
pub mod stats;
pub mod xds_client;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use identity::{CertSource, IdentityConfig, KeyAlgorithm, MountedFiles};
pub use inputs::Inputs;
use proxy_config::{ProxyConfigOverlay, overlay_into};
pub use xds_client::{RootCa, TOKEN_PATH, XdsClientConfig};

#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid {input} {value:?}: expected {expected}")]
pub struct ConfigError {
    pub input: String,
    pub value: String,
    pub expected: String,
}

fn err(input: &str, value: &str, expected: &str) -> ConfigError {
    ConfigError {
        input: input.to_string(),
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

/// ProxyConfig's default discoveryAddress.
pub const DEFAULT_DISCOVERY_ADDRESS: &str = "istiod.istio-system.svc:15012";

/// Where the agent gets xDS from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlPlaneSource {
    /// istiod-core in process, reading this config directory.
    /// The embedded control plane on `config_dir`, with the agent's mesh config file (when
    /// there is one) as its MeshConfig.
    Embedded {
        config_dir: PathBuf,
        mesh_file: Option<PathBuf>,
    },
    /// A remote control plane over plaintext gRPC (`host:port`).
    Remote { address: String },
}

/// Everything `run` needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub proxy_type: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub instance_ips: Vec<IpAddr>,
    pub dns_domain: String,
    pub service_cluster: String,
    pub service_account: String,
    /// OTEL_RESOURCE_ATTRIBUTES of the pod, if any (Envoy's OpenTelemetry tracer adds its
    /// `service.name` to them).
    pub otel_resource_attributes: Option<String>,
    pub config_path: PathBuf,
    pub binary_path: PathBuf,
    pub drain_duration: Duration,
    /// ProxyConfig connectTimeout: the bootstrap xds-grpc cluster's connect timeout (1s unset).
    pub connect_timeout: Option<Duration>,
    /// ProxyConfig tracing.zipkin.address: a Zipkin tracer and cluster in the bootstrap.
    pub zipkin_address: Option<String>,
    /// `--dnsRefreshRate`: the bootstrap's STRICT_DNS clusters' refresh rate (300s).
    pub dns_refresh_rate: Duration,
    pub termination_drain_duration: Duration,
    pub admin_port: u16,
    pub status_port: u16,
    pub concurrency: Option<u32>,
    pub proxy_log_level: String,
    pub proxy_component_log_level: String,
    pub control_plane: ControlPlaneSource,
    /// `ISTIO_META_*` → metadata key without the prefix.
    pub metadata: Vec<(String, String)>,
    /// uid/gid to run Envoy as when the agent is root.
    pub envoy_uid: u32,
    /// Delta xDS (ISTIO_DELTA_XDS, default true) or state of the world.
    pub delta_xds: bool,
    /// EXIT_ON_ZERO_ACTIVE_CONNECTIONS: on SIGTERM wait for connections to reach zero.
    pub exit_on_zero_active_connections: bool,
    /// MINIMUM_DRAIN_DURATION (5s).
    pub minimum_drain_duration: Duration,
    /// Pod labels (./etc/istio/pod/labels, without pod-template-hash, plus ISTIO_METAJSON_LABELS).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Pod annotations (./etc/istio/pod/annotations).
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Which Envoy stats exist and their tags (Istio's inclusion list and tag extraction).
    pub stats: stats::StatsConfig,
    /// ProxyConfig runtimeValues: Envoy runtime keys over Istio's defaults (`""` removes one).
    pub runtime_values: BTreeMap<String, String>,
    /// `ISTIO_METAJSON_*` → metadata key with a JSON value.
    pub metadata_json: Vec<(String, serde_json::Value)>,
    /// The ProxyConfig fields set by the mesh config, PROXY_CONFIG and the annotation, merged.
    pub proxy_config_json: serde_json::Value,
    /// ISTIO_BOOTSTRAP_OVERRIDE: a YAML/JSON file merged over the bootstrap by Envoy (`--config-yaml`).
    pub bootstrap_override: Option<serde_json::Value>,
    /// Dial options for a remote control plane.
    pub xds_client: Option<XdsClientConfig>,
    /// A custom bootstrap template (ISTIO_BOOTSTRAP > --templateFile > ProxyConfig
    /// proxyBootstrapTemplatePath / customConfigFile): a YAML/JSON fragment deep-merged over the
    /// generated bootstrap by the agent, so envoy-rev.json shows the result.
    pub bootstrap_template: Option<serde_json::Value>,
    /// Envoy's locality, from the pod's topology labels.
    pub locality: Locality,
    /// Rewritten app probes (ISTIO_KUBE_APP_PROBERS), by 15020 path.
    pub app_probes: std::collections::BTreeMap<String, probes::Probe>,
    /// Where app probes are dialled: the pod IP, or localhost with
    /// REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION.
    pub probe_target: IpAddr,
    /// The application's metrics to merge into 15020's exposition.
    pub app_metrics: Option<metrics::AppMetrics>,
    /// PILOT_AGENT_MERGE_ENVOY_STATS (default true): Envoy's metrics in 15020's exposition.
    pub merge_envoy_stats: bool,
    /// ProxyConfig readinessProbe: the VM health check reported to istiod (`crate::health`).
    pub health_probe: Option<health::HealthProbe>,
    /// The DNS proxy, when ISTIO_META_DNS_CAPTURE or ISTIO_META_ENABLE_DNS_SERVER is true.
    pub dns: Option<DnsConfig>,
    /// The workload certificate: identity, key type, lifetime, where it comes from.
    pub identity: IdentityConfig,
    /// The embedded control plane's own settings (istiod's env vars).
    pub embedded: embedded::EmbeddedSettings,
    /// Istio 1.27–1.31's settings for Envoy's bootstrap and command line.
    pub features: features::EnvoyFeatures,
    /// XDS_ADAPT: remove Istio-only extensions from xDS responses for upstream Envoy (on by
    /// default with a remote control plane; istiod-core emits none).
    pub xds_adapt: bool,
}

/// The DNS proxy's listen address and upstream resolvers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    pub listen: std::net::SocketAddr,
    pub upstreams: Vec<std::net::SocketAddr>,
    pub forward_timeout: Duration,
    pub forward_parallel: bool,
    /// The first `search` domain of resolv.conf.
    pub search: Option<String>,
}

/// Envoy node locality.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub sub_zone: String,
}

impl Locality {
    /// Istio's label `topology.istio.io/locality` (`region/zone/subzone`, also `.`-separated),
    /// else the Kubernetes topology labels.
    fn from_labels(labels: &std::collections::BTreeMap<String, String>) -> Locality {
        if let Some(l) = labels.get("topology.istio.io/locality") {
            let mut parts = l.split(['/', '.']).map(str::to_string);
            return Locality {
                region: parts.next().unwrap_or_default(),
                zone: parts.next().unwrap_or_default(),
                sub_zone: parts.next().unwrap_or_default(),
            };
        }
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        Locality {
            region: get("topology.kubernetes.io/region"),
            zone: get("topology.kubernetes.io/zone"),
            sub_zone: get("topology.istio.io/subzone"),
        }
    }
}

/// Reads a bootstrap fragment; Istio's Go templates are refused by name rather than misread.
fn read_bootstrap_fragment(input: &str, path: &str) -> Result<serde_json::Value, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(input, path, &format!("a readable file ({e})")))?;
    if text.contains("{{") {
        return Err(err(
            input,
            path,
            "a YAML or JSON bootstrap fragment (Go templates are not supported)",
        ));
    }
    serde_yaml_ng::from_str(&text).map_err(|e| {
        err(
            input,
            path,
            &format!("a YAML or JSON bootstrap fragment ({e})"),
        )
    })
}

/// A boolean env var as Istio reads it (`strconv.ParseBool`); unset or empty is `default`. Istio
/// warns and uses the default on any other value; here it is an error naming the variable.
fn parse_bool(name: &str, value: Option<String>, default: bool) -> Result<bool, ConfigError> {
    match value.as_deref() {
        None | Some("") => Ok(default),
        Some(raw) => go_bool(name, raw),
    }
}

/// One of Go's boolean spellings, else an error naming `input`.
fn go_bool(input: &str, raw: &str) -> Result<bool, ConfigError> {
    mesh_common::parse_go_bool(raw).ok_or_else(|| {
        err(
            input,
            raw,
            &format!("a boolean: {}", mesh_common::GO_BOOL_VALUES),
        )
    })
}

/// Command-line options of `pilot-agent proxy` that reach the config.
#[derive(Debug, Clone, Default)]
pub struct ProxyArgs {
    pub proxy_type: String,
    pub domain: Option<String>,
    pub service_cluster: Option<String>,
    pub proxy_log_level: String,
    pub proxy_component_log_level: String,
    pub concurrency: Option<u32>,
    pub config_dir: Option<PathBuf>,
    pub mesh_config: Option<PathBuf>,
    /// Directory of the downward-API files `labels` and `annotations` (./etc/istio/pod).
    pub pod_info_dir: Option<PathBuf>,
    /// `--templateFile`: a bootstrap fragment merged over the generated bootstrap.
    pub template_file: Option<PathBuf>,
    /// The resolv.conf whose nameservers the DNS proxy forwards to (/etc/resolv.conf).
    pub resolv_conf: Option<PathBuf>,
    /// Istio 1.5's injector flags (`--drainDuration`, `--discoveryAddress`, ...).
    pub legacy: legacy_flags::LegacyFlags,
}

/// Parses a Kubernetes downward-API file (`key="value"` per line, values Go-quoted).
pub fn parse_downward_api(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let (k, v) = line.split_once('=')?;
            let v = v.trim();
            let value = serde_json::from_str::<String>(v)
                .unwrap_or_else(|_| v.trim_matches('"').to_string());
            Some((k.trim().to_string(), value))
        })
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// A Go duration (`45s`, `500ms`, `1m30s`), checked: an error names `input`.
pub fn parse_duration(input: &str, raw: &str) -> Result<Duration, ConfigError> {
    mesh_common::parse_go_duration(raw).map_err(|e| {
        err(
            input,
            raw,
            &format!("a duration such as 5s, 500ms or 1m30s ({e})"),
        )
    })
}

impl Config {
    /// Reads the input files (`Inputs::read`), then parses them with the flags and the env.
    pub fn from_env(
        args: &ProxyArgs,
        lookup: &dyn Fn(&str) -> Option<String>,
        env_vars: &[(String, String)],
        user_uid: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Config, ConfigError> {
        let inputs = Inputs::read(args)?;
        Config::parse(args, &inputs, lookup, env_vars, user_uid)
    }

    /// `from_env` over the process environment: what the binary calls.
    pub fn from_process_env(
        args: &ProxyArgs,
        user_uid: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Config, ConfigError> {
        let env_vars: Vec<(String, String)> = std::env::vars().collect();
        Config::from_env(args, &process_env, &env_vars, user_uid)
    }

    /// The config from the flags, the files already read and the env; reads nothing else.
    pub fn parse(
        args: &ProxyArgs,
        inputs: &Inputs,
        lookup: &dyn Fn(&str) -> Option<String>,
        env_vars: &[(String, String)],
        user_uid: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Config, ConfigError> {
        let pod_name = lookup(env::POD_NAME).unwrap_or_else(|| "unknown".to_string());
        let pod_namespace = lookup(env::POD_NAMESPACE).unwrap_or_else(|| "default".to_string());
        let instance_ips = instance_ips(lookup)?;
        let mut labels = downward_api(inputs.labels.as_deref());
        labels.remove("pod-template-hash");
        let annotations = downward_api(inputs.annotations.as_deref());
        let (mut pc, mut merged) = proxy_config(inputs, lookup, &annotations)?;
        let flags = args
            .legacy
            .apply(&mut pc, &mut merged, args.template_file.is_some())?;
        let metadata_json = metadata_json(env_vars, &mut labels)?;
        let (bootstrap_override, bootstrap_template) = bootstrap_fragments(args, lookup, &merged)?;
        let locality = Locality::from_labels(&labels);
        let (app_probes, probe_target) = app_probes(lookup, &instance_ips)?;
        let dns = DnsConfig::from_env(lookup, &pc, inputs)?;
        let admin_port = pc
            .proxy_admin_port
            .unwrap_or(proxy_config::DEFAULT_ADMIN_PORT);
        let status_port = pc.status_port.unwrap_or(proxy_config::DEFAULT_STATUS_PORT);
        let features = features::EnvoyFeatures::parse(lookup, &pc)?;
        check_ports(
            &pc,
            (admin_port, status_port),
            dns.as_ref(),
            &features,
            lookup,
        )?;
        let app_metrics = match lookup(env::ISTIO_PROMETHEUS_ANNOTATIONS) {
            Some(json) if !json.trim().is_empty() => metrics::parse_app_metrics(&json)
                .map_err(|why| err(env::ISTIO_PROMETHEUS_ANNOTATIONS, &json, &why))?,
            _ => None,
        };
        let control_plane = control_plane(args, inputs, &pc);
        let connect_timeout = optional_duration("connectTimeout", &pc.connect_timeout)?;
        // Checked, not used: Istio's agent stopped passing `--parent-shutdown-time-s` (1.31).
        optional_duration("parentShutdownDuration", &pc.parent_shutdown_duration)?;
        let xds_client = match &control_plane {
            ControlPlaneSource::Remote { address } => {
                let mut client = XdsClientConfig::from_env(address, lookup, env_vars)?;
                client.apply_proxy_config(address, &pc, connect_timeout)?;
                Some(client)
            }
            ControlPlaneSource::Embedded { .. } => None,
        };
        let remote = matches!(control_plane, ControlPlaneSource::Remote { .. });
        let xds_adapt = parse_bool(env::XDS_ADAPT, lookup(env::XDS_ADAPT), remote)?;
        let service_account = lookup(env::SERVICE_ACCOUNT).unwrap_or_else(|| "default".to_string());
        let workload = identity::Workload {
            namespace: &pod_namespace,
            service_account: &service_account,
            control_plane: &control_plane,
            mounted: inputs.mounted_certs,
            trust_domain_flag: flags.trust_domain.as_deref(),
        };
        let identity = IdentityConfig::from_env(lookup, env_vars, &workload)?;
        let lifecycle = Lifecycle::from_env(lookup)?;
        let service_cluster = service_cluster_or_default(
            args.service_cluster
                .clone()
                .or(pc.service_cluster.clone())
                .unwrap_or_default(),
            pc.tracing_service_name.as_deref(),
            &labels,
            lookup(env::WORKLOAD_NAME).as_deref(),
            &pod_namespace,
        )?;
        let stats = stats::StatsConfig::from_inputs(&stats::StatsInputs {
            matcher: pc.proxy_stats_matcher.as_ref(),
            extra_stat_tags: pc.extra_stat_tags.as_deref(),
            annotations: &annotations,
            instance_ips: &instance_ips,
            exit_on_zero_active_connections: lifecycle.exit_on_zero_active_connections,
        })?;
        Ok(Config {
            proxy_type: args.proxy_type.clone(),
            dns_domain: args
                .domain
                .clone()
                .unwrap_or_else(|| format!("{pod_namespace}.svc.cluster.local")),
            pod_name,
            pod_namespace,
            instance_ips,
            service_cluster,
            service_account,
            otel_resource_attributes: lookup(env::OTEL_RESOURCE_ATTRIBUTES)
                .filter(|v| !v.is_empty()),
            config_path: PathBuf::from(
                pc.config_path
                    .clone()
                    .unwrap_or_else(|| proxy_config::DEFAULT_CONFIG_PATH.into()),
            ),
            binary_path: PathBuf::from(
                pc.binary_path
                    .clone()
                    .unwrap_or_else(|| proxy_config::DEFAULT_BINARY_PATH.into()),
            ),
            drain_duration: proxy_duration(
                "drainDuration",
                &pc.drain_duration,
                proxy_config::DEFAULT_DRAIN_SECS,
            )?,
            connect_timeout,
            zipkin_address: legacy_flags::zipkin_address(&pc)?,
            dns_refresh_rate: flags.dns_refresh_rate,
            termination_drain_duration: proxy_duration(
                "terminationDrainDuration",
                &pc.termination_drain_duration,
                proxy_config::DEFAULT_TERMINATION_DRAIN_SECS,
            )?,
            admin_port,
            status_port,
            // Concurrency: the flag, then ProxyConfig, then ISTIO_CPU_LIMIT (as Istio).
            concurrency: args
                .concurrency
                .filter(|c| *c > 0)
                .or(pc.concurrency)
                .or(lifecycle.cpu_limit.filter(|c| *c > 0)),
            proxy_log_level: args.proxy_log_level.clone(),
            proxy_component_log_level: args.proxy_component_log_level.clone(),
            control_plane,
            metadata: metadata(&pc, env_vars),
            envoy_uid: user_uid(&envoy_user(lookup)).unwrap_or(1337),
            delta_xds: lifecycle.delta_xds,
            exit_on_zero_active_connections: lifecycle.exit_on_zero_active_connections,
            minimum_drain_duration: lifecycle.minimum_drain_duration,
            labels,
            annotations,
            stats,
            runtime_values: pc.runtime_values.clone().unwrap_or_default(),
            metadata_json,
            proxy_config_json: {
                proxy_config::normalize_durations(&mut merged);
                serde_json::Value::Object(merged)
            },
            bootstrap_override,
            xds_client,
            bootstrap_template,
            locality,
            app_probes,
            probe_target,
            app_metrics,
            health_probe: pc
                .readiness_probe
                .as_ref()
                .filter(|v| !v.is_null())
                .map(health::parse)
                .transpose()?,
            merge_envoy_stats: parse_bool(
                env::PILOT_AGENT_MERGE_ENVOY_STATS,
                lookup(env::PILOT_AGENT_MERGE_ENVOY_STATS),
                true,
            )?,
            dns,
            identity,
            embedded: embedded::EmbeddedSettings::from_env(lookup)?,
            features,
            xds_adapt,
        })
    }
    /// Envoy's node id: `<type>~<ip>~<pod>.<namespace>~<domain>`.
    pub fn node_id(&self) -> String {
        let ip = self
            .instance_ips
            .first()
            .map(ToString::to_string)
            .unwrap_or_default();
        format!(
            "{}~{ip}~{}.{}~{}",
            self.proxy_type, self.pod_name, self.pod_namespace, self.dns_domain
        )
    }

    pub fn bootstrap_path(&self) -> PathBuf {
        self.config_path.join("envoy-rev.json")
    }

    pub fn xds_socket_path(&self) -> PathBuf {
        self.config_path.join("XDS")
    }
}

/// Envoy's admin port, the status port and the DNS proxy's port, checked against each other and
/// the fixed ports (`ports::check`).
fn check_ports(
    pc: &ProxyConfigOverlay,
    (admin_port, status_port): (u16, u16),
    dns: Option<&DnsConfig>,
    features: &features::EnvoyFeatures,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let mut chosen = vec![
        ports::Chosen {
            port: admin_port,
            what: "Envoy's admin port",
            field: "proxyAdminPort",
            set_by: pc.set_by.get("proxyAdminPort").cloned(),
        },
        ports::Chosen {
            port: status_port,
            what: "the agent's status port",
            field: "statusPort",
            set_by: pc.set_by.get("statusPort").cloned(),
        },
    ];
    if let Some(dns) = dns {
        chosen.push(ports::Chosen {
            port: dns.listen.port(),
            what: "the DNS proxy",
            field: env::DNS_PROXY_ADDR,
            set_by: lookup(env::DNS_PROXY_ADDR).map(|_| env::DNS_PROXY_ADDR.to_string()),
        });
    }
    for (port, what, field) in [
        (
            features.secure_metrics_port,
            "Envoy's mTLS metrics port",
            "ENVOY_SECURE_METRICS_PORT",
        ),
        (
            features.secure_merged_metrics_port,
            "the merged metrics' mTLS port",
            "ENVOY_SECURE_MERGED_METRICS_PORT",
        ),
    ] {
        if let Some(port) = port {
            chosen.push(ports::Chosen {
                port,
                what,
                field,
                set_by: Some(field.to_string()),
            });
        }
    }
    ports::check(&chosen)
}

/// INSTANCE_IP: the pod's addresses, comma-separated (127.0.0.1 when unset).
fn instance_ips(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Vec<IpAddr>, ConfigError> {
    let Some(raw) = lookup(env::INSTANCE_IP) else {
        return Ok(vec![IpAddr::from([127, 0, 0, 1])]);
    };
    raw.split(',')
        .map(|s| {
            s.trim().parse::<IpAddr>().map_err(|_| {
                err(
                    env::INSTANCE_IP,
                    &raw,
                    "a comma-separated list of IP addresses",
                )
            })
        })
        .collect()
}

fn downward_api(text: Option<&str>) -> BTreeMap<String, String> {
    text.map(parse_downward_api).unwrap_or_default()
}

/// ISTIO_KUBE_APP_PROBERS, and where the probes are dialled: the pod IP, or localhost with
/// REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION.
fn app_probes(
    lookup: &dyn Fn(&str) -> Option<String>,
    instance_ips: &[IpAddr],
) -> Result<(BTreeMap<String, probes::Probe>, IpAddr), ConfigError> {
    let app_probes = match lookup(env::ISTIO_KUBE_APP_PROBERS) {
        Some(json) if !json.trim().is_empty() => {
            probes::parse(&json).map_err(|why| err(env::ISTIO_KUBE_APP_PROBERS, &json, &why))?
        }
        _ => Default::default(),
    };
    let legacy_localhost = parse_bool(
        env::REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION,
        lookup(env::REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION),
        false,
    )?;
    let localhost = IpAddr::from([127, 0, 0, 1]);
    let probe_target = match instance_ips.first() {
        Some(ip) if !legacy_localhost => *ip,
        _ => localhost,
    };
    Ok((app_probes, probe_target))
}

/// ProxyConfig overlaid in Istio's order: the mesh config file, PROXY_CONFIG, the pod annotation;
/// then the discoveryAddress and status port annotations. Also the merged raw fields.
fn proxy_config(
    inputs: &Inputs,
    lookup: &dyn Fn(&str) -> Option<String>,
    annotations: &BTreeMap<String, String>,
) -> Result<
    (
        ProxyConfigOverlay,
        serde_json::Map<String, serde_json::Value>,
    ),
    ConfigError,
> {
    let mut pc = ProxyConfigOverlay::default();
    let mut merged = proxy_config::defaults();
    if let Some((path, text)) = &inputs.mesh_config {
        let input = format!("meshConfig file {}", path.display());
        overlay_into(&mut pc, &mut merged, &input, text)?;
    }
    if let Some(text) = lookup(env::PROXY_CONFIG) {
        let input = format!("env {}", env::PROXY_CONFIG);
        overlay_into(&mut pc, &mut merged, &input, &text)?;
    }
    if let Some(text) = annotations.get("proxy.istio.io/config") {
        overlay_into(
            &mut pc,
            &mut merged,
            "annotation proxy.istio.io/config",
            text,
        )?;
    }
    if let Some(addr) = annotations.get("sidecar.istio.io/discoveryAddress") {
        pc.discovery_address = Some(addr.clone());
        merged.insert("discoveryAddress".into(), addr.clone().into());
    }
    if let Some(port) = annotations.get("status.sidecar.istio.io/port") {
        pc.status_port = Some(port.parse().map_err(|_| {
            err(
                "annotation status.sidecar.istio.io/port",
                port,
                "a port number",
            )
        })?);
        merged.insert("statusPort".into(), pc.status_port.into());
        pc.set_by.insert(
            "statusPort".into(),
            "annotation status.sidecar.istio.io/port".into(),
        );
    }
    Ok((pc, merged))
}

/// `ISTIO_METAJSON_*`, sorted by key; ISTIO_METAJSON_LABELS is added to `labels` instead.
fn metadata_json(
    env_vars: &[(String, String)],
    labels: &mut BTreeMap<String, String>,
) -> Result<Vec<(String, serde_json::Value)>, ConfigError> {
    let mut metadata_json = Vec::new();
    for (k, v) in env_vars {
        if let Some(key) = k.strip_prefix(env::ISTIO_METAJSON_PREFIX) {
            let value: serde_json::Value =
                serde_json::from_str(v).map_err(|_| err(k, v, "a JSON value"))?;
            if key == "LABELS"
                && let Some(obj) = value.as_object()
            {
                for (lk, lv) in obj {
                    labels.insert(lk.clone(), lv.as_str().unwrap_or_default().to_string());
                }
            } else {
                metadata_json.push((key.to_string(), value));
            }
        }
    }
    metadata_json.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(metadata_json)
}

/// ISTIO_BOOTSTRAP_OVERRIDE, and the bootstrap template (see `Config::bootstrap_template`). Read
/// here rather than in `Inputs`: ProxyConfig may name the template.
fn bootstrap_fragments(
    args: &ProxyArgs,
    lookup: &dyn Fn(&str) -> Option<String>,
    merged: &serde_json::Map<String, serde_json::Value>,
) -> Result<(Option<serde_json::Value>, Option<serde_json::Value>), ConfigError> {
    let bootstrap_override = match lookup(env::ISTIO_BOOTSTRAP_OVERRIDE) {
        Some(path) if !path.is_empty() => Some(read_bootstrap_fragment(
            env::ISTIO_BOOTSTRAP_OVERRIDE,
            &path,
        )?),
        _ => None,
    };
    let template = lookup(env::ISTIO_BOOTSTRAP)
        .filter(|p| !p.is_empty())
        .map(|p| (format!("env {}", env::ISTIO_BOOTSTRAP), p))
        .or_else(|| {
            args.template_file
                .as_ref()
                .map(|p| ("--templateFile".to_string(), p.display().to_string()))
        })
        .or_else(|| {
            ["proxyBootstrapTemplatePath", "customConfigFile"]
                .iter()
                .find_map(|f| {
                    merged
                        .get(*f)
                        .and_then(|v| v.as_str())
                        .filter(|p| !p.is_empty())
                        .map(|p| (format!("ProxyConfig.{f}"), p.to_string()))
                })
        });
    let bootstrap_template = match template {
        Some((input, path)) => Some(read_bootstrap_fragment(&input, &path)?),
        None => None,
    };
    Ok((bootstrap_override, bootstrap_template))
}

/// `--configDir` (embedded), else ProxyConfig's discoveryAddress, else Istio's default.
fn control_plane(args: &ProxyArgs, inputs: &Inputs, pc: &ProxyConfigOverlay) -> ControlPlaneSource {
    match (&args.config_dir, &pc.discovery_address) {
        (Some(dir), _) => ControlPlaneSource::Embedded {
            config_dir: dir.clone(),
            mesh_file: inputs.mesh_config.as_ref().map(|(path, _)| path.clone()),
        },
        (None, Some(addr)) => ControlPlaneSource::Remote {
            address: addr.clone(),
        },
        (None, None) => ControlPlaneSource::Remote {
            address: DEFAULT_DISCOVERY_ADDRESS.to_string(),
        },
    }
}

/// One value per key: ProxyConfig's proxyMetadata, overridden by the process env (a VM's
/// cluster.env and its mesh config usually both carry ISTIO_META_CLUSTER_ID).
fn metadata(pc: &ProxyConfigOverlay, env_vars: &[(String, String)]) -> Vec<(String, String)> {
    let mut by_key = BTreeMap::new();
    let env_pairs = env_vars.iter().map(|(k, v)| (k, v));
    let meta_pairs = pc.proxy_metadata.iter().flatten().chain(env_pairs);
    for (k, v) in meta_pairs {
        if let Some(key) = k.strip_prefix(env::ISTIO_META_PREFIX) {
            by_key.insert(key.to_string(), v.clone());
        }
    }
    by_key.into_iter().collect()
}

/// Envoy's `node.cluster` as Istio names it (pkg/bootstrap/config.go `serviceClusterOrDefault`):
/// a name set by the flag or ProxyConfig, unless it is empty or `istio-proxy`; else the app
/// label (`app`, `app.kubernetes.io/name`, `service.istio.io/canonical-name`) dot namespace;
/// else the workload name dot namespace; else `istio-proxy.NAMESPACE`.
fn service_cluster_or_default(
    name: String,
    tracing_service_name: Option<&str>,
    labels: &BTreeMap<String, String>,
    workload: Option<&str>,
    namespace: &str,
) -> Result<String, ConfigError> {
    if !name.is_empty() && name != "istio-proxy" {
        return Ok(name);
    }
    let workload = workload.filter(|w| !w.is_empty());
    // ProxyConfig tracingServiceName (the other side of serviceCluster's oneof).
    let canonical = || {
        [
            "service.istio.io/canonical-name",
            "app.kubernetes.io/name",
            "app",
        ]
        .iter()
        .find_map(|k| labels.get(*k).map(String::as_str))
        .or(workload)
        .unwrap_or("istio-proxy")
        .to_string()
    };
    match tracing_service_name {
        None | Some("APP_LABEL_AND_NAMESPACE") => {}
        Some("CANONICAL_NAME_ONLY") => return Ok(canonical()),
        Some("CANONICAL_NAME_AND_NAMESPACE") => return Ok(format!("{}.{namespace}", canonical())),
        Some(other) => {
            return Err(err(
                "ProxyConfig.tracingServiceName",
                other,
                "APP_LABEL_AND_NAMESPACE, CANONICAL_NAME_ONLY or CANONICAL_NAME_AND_NAMESPACE",
            ));
        }
    }
    let app = [
        "app",
        "app.kubernetes.io/name",
        "service.istio.io/canonical-name",
    ]
    .iter()
    .find_map(|k| labels.get(*k));
    Ok(match (app, workload) {
        (Some(app), _) => format!("{app}.{namespace}"),
        (None, Some(w)) => format!("{w}.{namespace}"),
        (None, None) if !namespace.is_empty() => format!("istio-proxy.{namespace}"),
        (None, None) => "istio-proxy".to_string(),
    })
}

/// A ProxyConfig duration field, or its default in seconds.
fn proxy_duration(field: &str, v: &Option<String>, default: u64) -> Result<Duration, ConfigError> {
    match v {
        Some(raw) => parse_duration(&format!("ProxyConfig.{field}"), raw),
        None => Ok(Duration::from_secs(default)),
    }
}

/// A ProxyConfig duration field that has no default.
fn optional_duration(field: &str, v: &Option<String>) -> Result<Option<Duration>, ConfigError> {
    v.as_deref()
        .map(|raw| parse_duration(&format!("ProxyConfig.{field}"), raw))
        .transpose()
}

/// ENVOY_USER: the user Envoy runs as when the agent is root (istio-proxy).
pub fn envoy_user(lookup: &dyn Fn(&str) -> Option<String>) -> String {
    lookup(env::ENVOY_USER).unwrap_or_else(|| "istio-proxy".to_string())
}

/// The process environment, for the binary's edge (`main`); everything else takes a lookup.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The env vars that shape the agent's lifecycle and the embedded control plane.
struct Lifecycle {
    delta_xds: bool,
    exit_on_zero_active_connections: bool,
    minimum_drain_duration: Duration,
    cpu_limit: Option<u32>,
}

impl Lifecycle {
    fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Lifecycle, ConfigError> {
        let delta_xds = parse_bool(env::ISTIO_DELTA_XDS, lookup(env::ISTIO_DELTA_XDS), true)?;
        let exit_on_zero_active_connections = parse_bool(
            env::EXIT_ON_ZERO_ACTIVE_CONNECTIONS,
            lookup(env::EXIT_ON_ZERO_ACTIVE_CONNECTIONS),
            false,
        )?;
        let minimum_drain_duration = match lookup(env::MINIMUM_DRAIN_DURATION) {
            Some(raw) => parse_duration(env::MINIMUM_DRAIN_DURATION, &raw)?,
            None => Duration::from_secs(5),
        };
        let cpu_limit = match lookup(env::ISTIO_CPU_LIMIT) {
            Some(raw) if !raw.trim().is_empty() => Some(
                raw.trim()
                    .parse::<u32>()
                    .map_err(|_| err(env::ISTIO_CPU_LIMIT, &raw, "a whole number of CPUs"))?,
            ),
            _ => None,
        };
        Ok(Lifecycle {
            delta_xds,
            exit_on_zero_active_connections,
            minimum_drain_duration,
            cpu_limit,
        })
    }
}

impl DnsConfig {
    /// The DNS proxy, when ISTIO_META_DNS_CAPTURE or ISTIO_META_ENABLE_DNS_SERVER is true (in
    /// the env or ProxyConfig's proxyMetadata), forwarding to resolv.conf's nameservers.
    fn from_env(
        lookup: &dyn Fn(&str) -> Option<String>,
        pc: &ProxyConfigOverlay,
        inputs: &Inputs,
    ) -> Result<Option<DnsConfig>, ConfigError> {
        // On when the env or proxyMetadata says so; a value in either must be a boolean.
        let meta_true = |name: &str| -> Result<bool, ConfigError> {
            let from_env = parse_bool(name, lookup(name), false)?;
            let from_metadata = parse_bool(
                &format!("ProxyConfig.proxyMetadata.{name}"),
                pc.proxy_metadata
                    .as_ref()
                    .and_then(|m| m.get(name).cloned()),
                false,
            )?;
            Ok(from_env || from_metadata)
        };
        let capture = meta_true(env::DNS_CAPTURE)?;
        let server = meta_true(env::ENABLE_DNS_SERVER)?;
        if !(capture || server) {
            return Ok(None);
        }
        let raw = lookup(env::DNS_PROXY_ADDR)
            .unwrap_or_else(|| format!("localhost:{}", ports::DNS_PROXY));
        let listen = raw
            .replacen("localhost:", "127.0.0.1:", 1)
            .parse::<SocketAddr>()
            .map_err(|_| {
                err(
                    env::DNS_PROXY_ADDR,
                    &raw,
                    "host:port with an IP or localhost",
                )
            })?;
        let resolv_text = match &inputs.resolv_conf {
            Ok(text) => text.clone().unwrap_or_default(),
            Err(e) => return Err(e.clone()),
        };
        let search = resolv_text.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("search"))
                .then(|| w.next().map(str::to_string))
                .flatten()
        });
        let upstreams = resolv_text
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("nameserver"))
                    .then(|| w.next()?.parse::<IpAddr>().ok())
                    .flatten()
            })
            .map(|ip| SocketAddr::new(ip, 53))
            .collect();
        let forward_timeout = match lookup(env::DNS_FORWARD_TIMEOUT) {
            Some(raw) => parse_duration(env::DNS_FORWARD_TIMEOUT, &raw)?,
            None => Duration::from_secs(5),
        };
        Ok(Some(DnsConfig {
            listen,
            upstreams,
            forward_timeout,
            forward_parallel: parse_bool(
                env::DNS_FORWARD_PARALLEL,
                lookup(env::DNS_FORWARD_PARALLEL),
                false,
            )?,
            search,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(env: &[(&str, &str)], args: ProxyArgs) -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let v2 = vars.clone();
        Config::from_env(
            &args,
            &move |k| v2.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            &vars,
            &|_| None,
        )
    }

    fn embedded() -> ProxyArgs {
        ProxyArgs {
            proxy_type: "sidecar".into(),
            config_dir: Some("/mesh".into()),
            ..Default::default()
        }
    }

    #[test]
    fn node_id_and_metadata_follow_istio() {
        let c = cfg(
            &[
                ("POD_NAME", "app-1"),
                ("POD_NAMESPACE", "shop"),
                ("INSTANCE_IP", "10.1.2.3"),
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            ],
            embedded(),
        )
        .unwrap();
        assert_eq!(
            c.node_id(),
            "sidecar~10.1.2.3~app-1.shop~shop.svc.cluster.local"
        );
        assert_eq!(c.metadata, vec![("CLUSTER_ID".into(), "Kubernetes".into())]);
        assert_eq!(c.status_port, 15020);
        assert_eq!(c.termination_drain_duration, Duration::from_secs(5));
    }

    #[test]
    fn remote_services_and_tracing_service_name_are_checked() {
        for (proxy_config, named) in [
            (
                r#"{"tracingServiceName": "CANONICAL"}"#,
                "ProxyConfig.tracingServiceName",
            ),
            (
                r#"{"statsdUdpAddress": "statsd"}"#,
                "ProxyConfig.statsdUdpAddress",
            ),
            (
                r#"{"envoyAccessLogService": {"address": "als:9000", "tlsSettings": {"mode": "SIMPLE"}}}"#,
                "ProxyConfig.envoyAccessLogService.tlsSettings",
            ),
            (
                r#"{"envoyMetricsService": {"address": "m:9001", "tcpKeepalive": {"time": "soon"}}}"#,
                "ProxyConfig.envoyMetricsService.tcpKeepalive.time",
            ),
        ] {
            let e = cfg(&[("PROXY_CONFIG", proxy_config)], embedded())
                .unwrap_err()
                .to_string();
            assert!(e.contains(named), "{proxy_config}: {e}");
        }
        let c = cfg(
            &[
                ("POD_NAMESPACE", "shop"),
                (
                    "PROXY_CONFIG",
                    r#"{"tracingServiceName": "CANONICAL_NAME_AND_NAMESPACE"}"#,
                ),
            ],
            embedded(),
        )
        .unwrap();
        assert_eq!(c.service_cluster, "istio-proxy.shop");
        assert!(c.proxy_config_json.get("serviceCluster").is_none());
    }

    #[test]
    fn secure_metrics_ports_collide_with_nothing() {
        for (env, named) in [
            (
                vec![
                    ("ENVOY_SECURE_METRICS_PORT", "15091"),
                    ("ENVOY_SECURE_MERGED_METRICS_PORT", "15091"),
                ],
                "ENVOY_SECURE_",
            ),
            (
                vec![("ENVOY_SECURE_METRICS_PORT", "15090")],
                "ENVOY_SECURE_METRICS_PORT",
            ),
            (
                vec![("ENVOY_SECURE_MERGED_METRICS_PORT", "15020")],
                "ENVOY_SECURE_MERGED_METRICS_PORT",
            ),
        ] {
            let e = cfg(&env, embedded()).unwrap_err().to_string();
            assert!(e.contains(named), "{env:?}: {e}");
        }
        let c = cfg(&[("ENVOY_SECURE_METRICS_PORT", "15091")], embedded()).unwrap();
        assert_eq!(c.features.secure_metrics_port, Some(15091));
    }

    #[test]
    fn metadata_has_one_value_per_key_and_the_env_wins() {
        // A VM: cluster.env (the env) and the mesh config's proxyMetadata name the same keys.
        let c = cfg(
            &[
                ("POD_NAMESPACE", "vmns"),
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
                (
                    "PROXY_CONFIG",
                    r#"{"proxyMetadata": {"ISTIO_META_CLUSTER_ID": "other", "ISTIO_META_MESH_ID": "m1"}}"#,
                ),
            ],
            embedded(),
        )
        .unwrap();
        assert_eq!(
            c.metadata,
            vec![
                ("CLUSTER_ID".into(), "Kubernetes".into()),
                ("MESH_ID".into(), "m1".into())
            ]
        );
    }

    #[test]
    fn proxy_config_overlays_defaults() {
        let c = cfg(
            &[(
                "PROXY_CONFIG",
                "{\"terminationDrainDuration\": \"1s\", \"binaryPath\": \"/opt/envoy\"}",
            )],
            embedded(),
        )
        .unwrap();
        assert_eq!(c.termination_drain_duration, Duration::from_secs(1));
        assert_eq!(c.binary_path, PathBuf::from("/opt/envoy"));
    }

    #[test]
    fn bad_input_is_named() {
        let e = cfg(&[("INSTANCE_IP", "10.1.2")], embedded()).unwrap_err();
        assert_eq!(e.input, "INSTANCE_IP");
        let e = cfg(&[("PROXY_CONFIG", "drainDuration: soon")], embedded()).unwrap_err();
        assert_eq!(e.input, "ProxyConfig.drainDuration");
        let e = cfg(&[("PROXY_CONFIG", "bogusField: 1")], embedded()).unwrap_err();
        assert_eq!(e.input, "env PROXY_CONFIG");
        assert_eq!(e.value, "bogusField");
        let e = cfg(
            &[("PROXY_CONFIG", "{\"drainDurationz\": \"1s\"}")],
            embedded(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("drainDurationz"), "{e}");
        let e = cfg(&[("ISTIO_METAJSON_X", "{not json")], embedded()).unwrap_err();
        assert_eq!(e.input, "ISTIO_METAJSON_X");
        // Fields of Istio's ProxyConfig that we do not act on are accepted.
        assert!(
            cfg(
                &[("PROXY_CONFIG", "holdApplicationUntilProxyStarts: true")],
                embedded()
            )
            .is_ok()
        );
        // Without --configDir the agent goes to Istio's default istiod address.
        let c = cfg(&[], ProxyArgs::default()).unwrap();
        assert_eq!(
            c.control_plane,
            ControlPlaneSource::Remote {
                address: DEFAULT_DISCOVERY_ADDRESS.into()
            }
        );
    }

    #[test]
    fn pod_annotations_overlay_proxy_config_last() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("annotations"),
            "proxy.istio.io/config=\"terminationDrainDuration: 7s\\nconcurrency: 3\"\nsidecar.istio.io/discoveryAddress=\"cp:15010\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("labels"),
            "app=\"web\"\npod-template-hash=\"abc\"\n",
        )
        .unwrap();
        let args = ProxyArgs {
            pod_info_dir: Some(dir.path().to_path_buf()),
            ..ProxyArgs::default()
        };
        let c = cfg(
            &[
                (
                    "PROXY_CONFIG",
                    "{\"terminationDrainDuration\": \"2s\", \"concurrency\": 1}",
                ),
                ("ISTIO_METAJSON_LABELS", "{\"version\": \"v1\"}"),
            ],
            args,
        )
        .unwrap();
        assert_eq!(c.termination_drain_duration, Duration::from_secs(7));
        assert_eq!(c.concurrency, Some(3));
        assert_eq!(
            c.control_plane,
            ControlPlaneSource::Remote {
                address: "cp:15010".into()
            }
        );
        assert_eq!(c.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(c.labels.get("version").map(String::as_str), Some("v1"));
        assert!(!c.labels.contains_key("pod-template-hash"));
        assert_eq!(c.proxy_config_json["concurrency"], 3);
    }

    #[test]
    fn remote_dial_options_follow_istio() {
        let c = cfg(
            &[
                ("PROXY_CONFIG", "discoveryAddress: localhost:15012"),
                ("XDS_HEADER_TENANT_ID", "blue"),
                ("PROV_CERT", "/etc/prov"),
            ],
            ProxyArgs::default(),
        )
        .unwrap();
        let x = c.xds_client.unwrap();
        assert!(x.tls);
        assert_eq!(x.server_name, "istiod.istio-system.svc");
        assert_eq!(
            x.headers,
            vec![
                ("clusterid".into(), "Kubernetes".into()),
                ("tenant-id".into(), "blue".into())
            ]
        );
        assert_eq!(
            x.root_ca,
            RootCa::Files(vec![
                "./etc/certs/root-cert.pem".into(),
                "/etc/prov/root-cert.pem".into(),
                "./var/run/secrets/istio/root-cert.pem".into()
            ])
        );
        let c = cfg(
            &[
                ("PROXY_CONFIG", "discoveryAddress: cp.example:15010"),
                ("ISTIOD_SAN", "x"),
            ],
            ProxyArgs::default(),
        )
        .unwrap();
        let x = c.xds_client.unwrap();
        assert!(!x.tls);
        assert_eq!(x.server_name, "x");
        let e = cfg(
            &[("PROXY_CONFIG", "discoveryAddress: nope")],
            ProxyArgs::default(),
        )
        .unwrap_err();
        assert_eq!(e.input, "discoveryAddress");
    }

    #[test]
    fn xds_adaptation_is_on_for_a_remote_control_plane() {
        let remote = [("PROXY_CONFIG", "discoveryAddress: cp.example:15010")];
        assert!(cfg(&remote, ProxyArgs::default()).unwrap().xds_adapt);
        assert!(!cfg(&[], embedded()).unwrap().xds_adapt);
        let off = [remote[0], ("XDS_ADAPT", "false")];
        assert!(!cfg(&off, ProxyArgs::default()).unwrap().xds_adapt);
        assert!(cfg(&[("XDS_ADAPT", "true")], embedded()).unwrap().xds_adapt);
        let e = cfg(&[("XDS_ADAPT", "sometimes")], embedded()).unwrap_err();
        assert_eq!(e.input, "XDS_ADAPT");
    }

    #[test]
    fn bootstrap_template_and_locality() {
        let dir = tempfile::tempdir().unwrap();
        let tpl = dir.path().join("tpl.yaml");
        std::fs::write(&tpl, "stats_config: {use_all_default_tags: false}\n").unwrap();
        std::fs::write(
            dir.path().join("labels"),
            "topology.istio.io/locality=\"eu/west-1a/rack9\"\n",
        )
        .unwrap();
        let args = ProxyArgs {
            pod_info_dir: Some(dir.path().to_path_buf()),
            template_file: Some(tpl.clone()),
            ..embedded()
        };
        let c = cfg(&[], args).unwrap();
        assert_eq!(
            c.bootstrap_template.unwrap()["stats_config"]["use_all_default_tags"],
            false
        );
        assert_eq!(c.locality.zone, "west-1a");
        assert_eq!(c.locality.sub_zone, "rack9");
        std::fs::write(&tpl, "{{ .node.id }}\n").unwrap();
        let e = cfg(&[("ISTIO_BOOTSTRAP", tpl.to_str().unwrap())], embedded()).unwrap_err();
        assert_eq!(e.input, "env ISTIO_BOOTSTRAP");
        assert!(
            e.to_string().contains("Go templates are not supported"),
            "{e}"
        );
    }

    #[test]
    fn an_unreadable_file_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("annotations")).unwrap();
        std::fs::create_dir(dir.path().join("resolv.conf")).unwrap();
        let args = ProxyArgs {
            pod_info_dir: Some(dir.path().to_path_buf()),
            ..embedded()
        };
        let e = cfg(&[], args).unwrap_err();
        assert_eq!(e.input, "pod annotations file");

        // resolv.conf matters only to the DNS proxy.
        let args = ProxyArgs {
            resolv_conf: Some(dir.path().join("resolv.conf")),
            ..embedded()
        };
        assert!(cfg(&[], args.clone()).is_ok());
        let e = cfg(&[("ISTIO_META_DNS_CAPTURE", "true")], args).unwrap_err();
        assert_eq!(e.input, "resolv.conf");
    }

    /// Every port of the proxy is its own and in 1..=65535; the error names the input that set
    /// the port and what else uses it.
    #[test]
    fn colliding_or_zero_ports_are_refused_naming_the_input() {
        let dns_on = ("ISTIO_META_DNS_CAPTURE", "true");
        type Env<'a> = &'a [(&'a str, &'a str)];
        #[rustfmt::skip]
        let cases: &[(Env, &str, &str, &str)] = &[
            // env, the input named, its value, what the error says it collides with
            (&[("PROXY_CONFIG", "proxyAdminPort: 15020")], "env PROXY_CONFIG proxyAdminPort", "15020", "the agent's status port (statusPort)"),
            (&[("PROXY_CONFIG", "statusPort: 15000")], "env PROXY_CONFIG statusPort", "15000", "Envoy's admin port (proxyAdminPort)"),
            (&[("PROXY_CONFIG", "proxyAdminPort: 15001")], "env PROXY_CONFIG proxyAdminPort", "15001", "outbound capture listener"),
            (&[("PROXY_CONFIG", "proxyAdminPort: 15006")], "env PROXY_CONFIG proxyAdminPort", "15006", "inbound capture listener"),
            (&[("PROXY_CONFIG", "statusPort: 15008")], "env PROXY_CONFIG statusPort", "15008", "HBONE tunnel"),
            (&[("PROXY_CONFIG", "statusPort: 15004")], "env PROXY_CONFIG statusPort", "15004", "agent debug port"),
            (&[("PROXY_CONFIG", "statusPort: 15021")], "env PROXY_CONFIG statusPort", "15021", "readiness listener"),
            (&[("PROXY_CONFIG", "proxyAdminPort: 15090")], "env PROXY_CONFIG proxyAdminPort", "15090", "Prometheus listener"),
            (&[("PROXY_CONFIG", "{proxyAdminPort: 16000, statusPort: 16000}")], "env PROXY_CONFIG", "16000", "(proxyAdminPort)"),
            (&[dns_on, ("PROXY_CONFIG", "proxyAdminPort: 15053")], "env PROXY_CONFIG proxyAdminPort", "15053", "the DNS proxy (DNS_PROXY_ADDR)"),
            (&[dns_on, ("DNS_PROXY_ADDR", "127.0.0.1:15020")], "DNS_PROXY_ADDR", "15020", "the agent's status port"),
            (&[dns_on, ("DNS_PROXY_ADDR", "localhost:15006")], "DNS_PROXY_ADDR", "15006", "inbound capture listener"),
            (&[dns_on, ("DNS_PROXY_ADDR", "localhost:0")], "DNS_PROXY_ADDR", "0", "a port from 1 to 65535 for the DNS proxy"),
            (&[("PROXY_CONFIG", "statusPort: 0")], "env PROXY_CONFIG statusPort", "0", "this agent always serves it"),
            (&[("PROXY_CONFIG", "proxyAdminPort: 0")], "env PROXY_CONFIG proxyAdminPort", "0", "a port from 1 to 65535 for Envoy's admin port"),
        ];
        for (env, input, value, says) in cases {
            let e = cfg(env, embedded()).expect_err(&format!("{env:?} accepted"));
            assert!(e.input.starts_with(input), "{env:?}: {e}");
            assert_eq!(e.value, *value, "{env:?}: {e}");
            assert!(e.expected.contains(says), "{env:?}: {e}");
        }
        // The same port, set elsewhere: the error names that input.
        let e = cfg(
            &[],
            ProxyArgs {
                legacy: legacy_flags::LegacyFlags {
                    proxy_admin_port: Some("15021".into()),
                    ..Default::default()
                },
                ..embedded()
            },
        )
        .unwrap_err();
        assert_eq!(
            (e.input.as_str(), e.value.as_str()),
            ("--proxyAdminPort", "15021")
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("annotations"),
            "status.sidecar.istio.io/port=\"0\"\n",
        )
        .unwrap();
        let annotated = ProxyArgs {
            pod_info_dir: Some(dir.path().to_path_buf()),
            ..embedded()
        };
        let e = cfg(&[], annotated).unwrap_err();
        assert_eq!(e.input, "annotation status.sidecar.istio.io/port");
        let mesh = dir.path().join("mesh");
        std::fs::write(&mesh, "defaultConfig: {proxyAdminPort: 15020}\n").unwrap();
        let meshed = ProxyArgs {
            mesh_config: Some(mesh.clone()),
            ..embedded()
        };
        let e = cfg(&[], meshed).unwrap_err();
        assert_eq!(
            e.input,
            format!("meshConfig file {} proxyAdminPort", mesh.display())
        );
        // The brief's example, as an operator reads it.
        let e = cfg(&[("PROXY_CONFIG", "proxyAdminPort: 15020")], embedded()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid env PROXY_CONFIG proxyAdminPort \"15020\": expected a port of its own for \
             Envoy's admin port: 15020 is also the agent's status port (statusPort)"
        );

        // Distinct ports are fine, moved together or apart; the DNS port counts only when on.
        for env in [
            &[("PROXY_CONFIG", "{proxyAdminPort: 15020, statusPort: 15000}")][..],
            &[("PROXY_CONFIG", "{proxyAdminPort: 25000, statusPort: 25020}")],
            &[("DNS_PROXY_ADDR", "127.0.0.1:15020")],
            &[dns_on, ("DNS_PROXY_ADDR", "127.0.0.1:25053")],
            &[
                dns_on,
                ("PROXY_CONFIG", "{statusPort: 15053}"),
                ("DNS_PROXY_ADDR", "127.0.0.1:25053"),
            ],
        ] {
            let c = cfg(env, embedded()).unwrap_or_else(|e| panic!("{env:?}: {e}"));
            assert_ne!(c.admin_port, c.status_port);
        }
    }

    /// Every boolean env var takes exactly Go's `strconv.ParseBool` spellings; anything else is
    /// an error naming the variable and the accepted values.
    #[test]
    fn boolean_env_vars_take_gos_spellings_only() {
        for var in [
            "ISTIO_META_DNS_CAPTURE",
            "ISTIO_META_ENABLE_DNS_SERVER",
            "ISTIO_DELTA_XDS",
            "EXIT_ON_ZERO_ACTIVE_CONNECTIONS",
            "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION",
            "XDS_ADAPT",
            "ISTIOD_CACHE_CHECK",
            "PILOT_SCOPE_GATEWAY_TO_NAMESPACE",
            "FILE_MOUNTED_CERTS",
        ] {
            // Certificates come from files or a remote CA only with a remote control plane.
            let args = || match var {
                "FILE_MOUNTED_CERTS" => ProxyArgs::default(),
                _ => embedded(),
            };
            for bad in ["yes", "no", "on", "tRuE", " true", "true\n", "2", "enabled"] {
                let e = cfg(&[(var, bad)], args()).expect_err(&format!("{var}={bad:?} accepted"));
                assert_eq!((e.input.as_str(), e.value.as_str()), (var, bad), "{e}");
                assert!(
                    e.expected
                        .contains("1, t, T, TRUE, true, True, 0, f, F, FALSE, false or False"),
                    "{e}"
                );
            }
            for good in [
                "1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False", "",
            ] {
                cfg(&[(var, good)], args()).unwrap_or_else(|e| panic!("{var}={good:?}: {e}"));
            }
        }
        let dns_on = ("ISTIO_META_DNS_CAPTURE", "true");
        let e = cfg(&[dns_on, ("DNS_FORWARD_PARALLEL", "yes")], embedded()).unwrap_err();
        assert_eq!(e.input, "DNS_FORWARD_PARALLEL");
        // The DNS proxy's switches in proxyMetadata too, named as such.
        let e = cfg(
            &[(
                "PROXY_CONFIG",
                "proxyMetadata: {ISTIO_META_DNS_CAPTURE: \"yes\"}",
            )],
            embedded(),
        )
        .unwrap_err();
        assert_eq!(e.input, "ProxyConfig.proxyMetadata.ISTIO_META_DNS_CAPTURE");
        // Go's other spellings turn it on (before, only `true` did).
        for on in ["1", "True", "T"] {
            assert!(
                cfg(&[("ISTIO_META_DNS_CAPTURE", on)], embedded())
                    .unwrap()
                    .dns
                    .is_some()
            );
            let pm = format!("proxyMetadata: {{ISTIO_META_ENABLE_DNS_SERVER: \"{on}\"}}");
            assert!(
                cfg(&[("PROXY_CONFIG", &pm)], embedded())
                    .unwrap()
                    .dns
                    .is_some()
            );
        }
        assert!(
            cfg(&[("ISTIO_META_DNS_CAPTURE", "false")], embedded())
                .unwrap()
                .dns
                .is_none()
        );
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("x", "1m30s").unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(
            parse_duration("x", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert!(parse_duration("x", "5").is_err());
        assert!(parse_duration("x", "").is_err());
    }

    #[test]
    fn hostile_durations_are_named_errors() {
        for (var, value) in [
            ("PROXY_CONFIG", "{\"drainDuration\": \"9999999999999999h\"}"),
            ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"NaNs\"}"),
            ("PROXY_CONFIG", "{\"drainDuration\": \"-5s\"}"),
            ("MINIMUM_DRAIN_DURATION", "1e308s"),
            ("SECRET_TTL", "99999999999999999999h"),
        ] {
            let e = cfg(&[(var, value)], ProxyArgs::default()).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("Duration") || text.contains(var),
                "{var}={value}: {text}"
            );
            assert!(text.contains("duration"), "{var}={value}: {text}");
        }
    }
}
