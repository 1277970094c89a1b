//! The `pilot-agent proxy` flags Istio 1.5's injector wrote (`--configPath`, `--drainDuration`,
//! `--discoveryAddress`, `--zipkinAddress`, ...; Istio 1.6 moved them into ProxyConfig). Istio
//! 1.5's agent started from `mesh.DefaultProxyConfig()` and set each ProxyConfig field from its
//! flag (`pilot/cmd/pilot-agent/main.go`); the mesh config's `defaultConfig` and the pod's
//! annotations reached it only through the injector, which rendered them into these flags. So
//! here a flag that is given is the last ProxyConfig source: it wins over the mesh config file,
//! PROXY_CONFIG and the `proxy.istio.io/config` and `sidecar.istio.io/*` annotations.
//!
//! Parsed from the raw text clap hands over, so an error names the flag and its value.

use std::time::Duration;

use super::proxy_config::{ProxyConfigOverlay, Tracing, Zipkin};
use super::{ConfigError, err, go_bool, parse_duration};

/// The flags as given (`--flag value` or `--flag=value`), unparsed.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct LegacyFlags {
    /// ProxyConfig configPath: where the bootstrap and the xDS socket are written.
    #[arg(long = "configPath")]
    pub config_path: Option<String>,
    /// ProxyConfig binaryPath: the Envoy binary.
    #[arg(long = "binaryPath")]
    pub binary_path: Option<String>,
    /// ProxyConfig drainDuration (Envoy --drain-time-s), a Go duration.
    #[arg(long = "drainDuration")]
    pub drain_duration: Option<String>,
    /// ProxyConfig parentShutdownDuration (Envoy --parent-shutdown-time-s), a Go duration.
    #[arg(long = "parentShutdownDuration")]
    pub parent_shutdown_duration: Option<String>,
    /// ProxyConfig discoveryAddress: the control plane, host:port.
    #[arg(long = "discoveryAddress")]
    pub discovery_address: Option<String>,
    /// ProxyConfig tracing.zipkin.address: a Zipkin tracer in the bootstrap, host:port.
    #[arg(long = "zipkinAddress")]
    pub zipkin_address: Option<String>,
    /// ProxyConfig connectTimeout: the xds-grpc cluster's and the control plane dial's timeout.
    #[arg(long = "connectTimeout")]
    pub connect_timeout: Option<String>,
    /// ProxyConfig proxyAdminPort: Envoy's admin port.
    #[arg(long = "proxyAdminPort")]
    pub proxy_admin_port: Option<String>,
    /// ProxyConfig controlPlaneAuthPolicy: NONE or MUTUAL_TLS.
    #[arg(long = "controlPlaneAuthPolicy")]
    pub control_plane_auth_policy: Option<String>,
    /// The dns_refresh_rate of the bootstrap's STRICT_DNS clusters (unset: 30s, what Istio's
    /// bootstrap template writes; Istio 1.5's injector passed 300s).
    #[arg(long = "dnsRefreshRate")]
    pub dns_refresh_rate: Option<String>,
    /// ProxyConfig statusPort: the agent's status port.
    #[arg(long = "statusPort")]
    pub status_port: Option<String>,
    /// The SPIFFE trust domain of the workload identity (wins over TRUST_DOMAIN).
    #[arg(long = "trust-domain")]
    pub trust_domain: Option<String>,
    /// Istio 1.5: `true` rendered `--templateFile` as a Go template for control-plane pods.
    #[arg(
        long = "controlPlaneBootstrap",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub control_plane_bootstrap: Option<String>,
}

/// ProxyConfig controlPlaneAuthPolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthPolicy {
    None,
    MutualTls,
}

impl AuthPolicy {
    pub(super) fn parse(input: &str, raw: &str) -> Result<AuthPolicy, ConfigError> {
        match raw {
            "NONE" => Ok(AuthPolicy::None),
            "MUTUAL_TLS" => Ok(AuthPolicy::MutualTls),
            _ => Err(err(input, raw, "NONE or MUTUAL_TLS")),
        }
    }
}

/// Istio's default `--dnsRefreshRate`.
pub const DEFAULT_DNS_REFRESH_RATE: Duration = Duration::from_secs(30);

/// What the flags set beyond ProxyConfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFlags {
    /// `--dnsRefreshRate`, or Istio's default.
    pub dns_refresh_rate: Duration,
    /// `--trust-domain`, when given.
    pub trust_domain: Option<String>,
}

impl LegacyFlags {
    /// Checks every flag and writes the ProxyConfig ones over `pc` and `merged` (the node's
    /// PROXY_CONFIG metadata, which then shows the effective values, as Istio 1.5's did).
    pub(super) fn apply(
        &self,
        pc: &mut ProxyConfigOverlay,
        merged: &mut serde_json::Map<String, serde_json::Value>,
        template_file: bool,
    ) -> Result<AgentFlags, ConfigError> {
        let mut set = |field: &str, value: serde_json::Value| {
            merged.insert(field.to_string(), value);
        };
        if let Some(v) = &self.config_path {
            non_empty("--configPath", v, "a directory")?;
            pc.config_path = Some(v.clone());
            set("configPath", v.as_str().into());
        }
        if let Some(v) = &self.binary_path {
            non_empty("--binaryPath", v, "the path of the Envoy binary")?;
            pc.binary_path = Some(v.clone());
            set("binaryPath", v.as_str().into());
        }
        for (flag, field, raw, target) in [
            (
                "--drainDuration",
                "drainDuration",
                &self.drain_duration,
                &mut pc.drain_duration,
            ),
            (
                "--parentShutdownDuration",
                "parentShutdownDuration",
                &self.parent_shutdown_duration,
                &mut pc.parent_shutdown_duration,
            ),
            (
                "--connectTimeout",
                "connectTimeout",
                &self.connect_timeout,
                &mut pc.connect_timeout,
            ),
        ] {
            if let Some(v) = raw {
                whole_seconds(flag, v)?;
                *target = Some(v.clone());
                set(field, v.as_str().into());
            }
        }
        if let Some(v) = &self.discovery_address {
            host_port("--discoveryAddress", v)?;
            pc.discovery_address = Some(v.clone());
            set("discoveryAddress", v.as_str().into());
        }
        if let Some(v) = &self.zipkin_address {
            host_port("--zipkinAddress", v)?;
            pc.tracing = Some(Tracing {
                zipkin: Some(Zipkin {
                    address: Some(v.clone()),
                }),
            });
            set(
                "tracing",
                serde_json::json!({ "zipkin": { "address": v.as_str() } }),
            );
        }
        for (flag, field, raw, target) in [
            (
                "--proxyAdminPort",
                "proxyAdminPort",
                &self.proxy_admin_port,
                &mut pc.proxy_admin_port,
            ),
            (
                "--statusPort",
                "statusPort",
                &self.status_port,
                &mut pc.status_port,
            ),
        ] {
            if let Some(v) = raw {
                let port = port(flag, v)?;
                *target = Some(port);
                set(field, port.into());
                pc.set_by.insert(field.to_string(), flag.to_string());
            }
        }
        if let Some(v) = &self.control_plane_auth_policy {
            AuthPolicy::parse("--controlPlaneAuthPolicy", v)?;
            pc.control_plane_auth_policy = Some(v.clone());
            set("controlPlaneAuthPolicy", v.as_str().into());
        }
        let dns_refresh_rate = match &self.dns_refresh_rate {
            Some(v) => {
                let rate = parse_duration("--dnsRefreshRate", v)?;
                // Envoy refuses a refresh rate below 1ms.
                if rate < Duration::from_millis(1) {
                    return Err(err("--dnsRefreshRate", v, "at least 1ms"));
                }
                rate
            }
            None => DEFAULT_DNS_REFRESH_RATE,
        };
        if let Some(v) = &self.trust_domain {
            non_empty("--trust-domain", v, "a trust domain such as cluster.local")?;
        }
        if let Some(v) = &self.control_plane_bootstrap
            && go_bool("--controlPlaneBootstrap", v)?
            && template_file
        {
            return Err(err(
                "--controlPlaneBootstrap",
                v,
                "false with --templateFile (Istio 1.5 rendered the file as a Go template for \
                 control-plane pods, which is not supported; with false it is merged over the \
                 bootstrap as a YAML/JSON fragment)",
            ));
        }
        Ok(AgentFlags {
            dns_refresh_rate,
            trust_domain: self.trust_domain.clone(),
        })
    }
}

/// ProxyConfig tracing.zipkin.address, checked.
pub(super) fn zipkin_address(pc: &ProxyConfigOverlay) -> Result<Option<String>, ConfigError> {
    let address = pc
        .tracing
        .as_ref()
        .and_then(|t| t.zipkin.as_ref())
        .and_then(|z| z.address.clone())
        .filter(|a| !a.is_empty());
    if let Some(a) = &address {
        host_port("ProxyConfig.tracing.zipkin.address", a)?;
    }
    Ok(address)
}

fn non_empty(flag: &str, v: &str, expected: &str) -> Result<(), ConfigError> {
    if v.trim().is_empty() {
        return Err(err(flag, v, expected));
    }
    Ok(())
}

/// A Go duration Envoy can take: its command line and clusters count whole seconds or
/// milliseconds, so only the range matters here.
fn whole_seconds(flag: &str, v: &str) -> Result<Duration, ConfigError> {
    let d = parse_duration(flag, v)?;
    if d.as_secs() > u64::from(u32::MAX) {
        return Err(err(flag, v, "a duration below 136 years"));
    }
    Ok(d)
}

fn port(flag: &str, v: &str) -> Result<u16, ConfigError> {
    v.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| err(flag, v, "a port number from 1 to 65535"))
}

fn host_port(flag: &str, v: &str) -> Result<(), ConfigError> {
    let ok = v
        .rsplit_once(':')
        .is_some_and(|(host, p)| !host.is_empty() && p.parse::<u16>().is_ok());
    if !ok {
        return Err(err(flag, v, "host:port"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ControlPlaneSource, Inputs, ProxyArgs};

    fn config(flags: LegacyFlags, mesh: &str, annotations: &str) -> Result<Config, ConfigError> {
        let args = ProxyArgs {
            proxy_type: "sidecar".into(),
            legacy: flags,
            ..ProxyArgs::default()
        };
        let inputs = Inputs {
            labels: None,
            annotations: Some(annotations.to_string()),
            mesh_config: Some(("/mesh".into(), mesh.to_string())),
            resolv_conf: Ok(None),
            mounted_certs: Default::default(),
        };
        Config::parse(&args, &inputs, &|_| None, &[], &|_| None)
    }

    const MESH: &str = "defaultConfig:\n  drainDuration: 10s\n  parentShutdownDuration: 20s\n  \
        connectTimeout: 2s\n  proxyAdminPort: 15100\n  statusPort: 15121\n  \
        discoveryAddress: mesh:15010\n  tracing: {zipkin: {address: 'mesh-zipkin:9411'}}\n";
    const ANNOTATIONS: &str = "proxy.istio.io/config=\"drainDuration: 11s\\nconcurrency: 4\"\n\
        sidecar.istio.io/discoveryAddress=\"annotated:15010\"\nstatus.sidecar.istio.io/port=\"15022\"\n";

    #[test]
    fn without_flags_proxy_config_sources_apply() {
        let c = config(LegacyFlags::default(), MESH, ANNOTATIONS).unwrap();
        assert_eq!(c.drain_duration, Duration::from_secs(11));
        assert_eq!(c.proxy_config_json["parentShutdownDuration"], "20s");
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(2)));
        assert_eq!(c.admin_port, 15100);
        assert_eq!(c.status_port, 15022);
        assert_eq!(c.zipkin_address.as_deref(), Some("mesh-zipkin:9411"));
        assert_eq!(
            c.control_plane,
            ControlPlaneSource::Remote {
                address: "annotated:15010".into()
            }
        );
        assert_eq!(c.dns_refresh_rate, DEFAULT_DNS_REFRESH_RATE);
    }

    #[test]
    fn a_given_flag_wins_over_mesh_config_and_annotations() {
        let flags = LegacyFlags {
            drain_duration: Some("3s".into()),
            parent_shutdown_duration: Some("4s".into()),
            connect_timeout: Some("5s".into()),
            proxy_admin_port: Some("16000".into()),
            status_port: Some("16020".into()),
            discovery_address: Some("flag:15010".into()),
            zipkin_address: Some("flag-zipkin:9411".into()),
            control_plane_auth_policy: Some("MUTUAL_TLS".into()),
            ..LegacyFlags::default()
        };
        let c = config(flags, MESH, ANNOTATIONS).unwrap();
        assert_eq!(c.drain_duration, Duration::from_secs(3));
        assert_eq!(c.proxy_config_json["parentShutdownDuration"], "4s");
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(5)));
        assert_eq!(c.admin_port, 16000);
        assert_eq!(c.status_port, 16020);
        assert_eq!(c.zipkin_address.as_deref(), Some("flag-zipkin:9411"));
        assert_eq!(
            c.control_plane,
            ControlPlaneSource::Remote {
                address: "flag:15010".into()
            }
        );
        // MUTUAL_TLS is TLS even on the plaintext port.
        assert!(c.xds_client.as_ref().unwrap().tls);
        // Fields no flag names keep their ProxyConfig value; the node metadata shows the result.
        assert_eq!(c.concurrency, Some(4));
        assert_eq!(c.proxy_config_json["drainDuration"], "3s");
        assert_eq!(c.proxy_config_json["proxyAdminPort"], 16000);
    }

    #[test]
    fn a_bad_zipkin_address_in_proxy_config_is_named() {
        let e = config(
            LegacyFlags::default(),
            "defaultConfig: {tracing: {zipkin: {address: nohost}}}",
            "",
        )
        .unwrap_err();
        assert_eq!(e.input, "ProxyConfig.tracing.zipkin.address");
        let e = config(
            LegacyFlags::default(),
            "defaultConfig: {controlPlaneAuthPolicy: SOMETIMES}",
            "",
        )
        .unwrap_err();
        assert_eq!(e.input, "ProxyConfig.controlPlaneAuthPolicy");
    }
}
