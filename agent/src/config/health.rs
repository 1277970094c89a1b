//! ProxyConfig `readinessProbe`: the WorkloadGroup `probe` a VM's agent runs (copied into the
//! VM's mesh config by `istioctl x workload entry configure`), with Istio's agent defaults
//! (`pkg/istio-agent/health`: failure and success thresholds 1, timeout 1 s, period 10 s, path
//! `/`, scheme HTTP). Validated as istiod validates a WorkloadGroup's probe, and stricter where
//! Istio's agent would misbehave (a probe without a method, a gRPC probe with a host).

use std::time::Duration;

use serde::Deserialize;

use super::probes::Check;
use super::{ConfigError, err};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Spec {
    #[serde(default)]
    initial_delay_seconds: Option<u32>,
    #[serde(default)]
    timeout_seconds: Option<u32>,
    #[serde(default)]
    period_seconds: Option<u32>,
    #[serde(default)]
    success_threshold: Option<u32>,
    #[serde(default)]
    failure_threshold: Option<u32>,
    #[serde(default)]
    http_get: Option<HttpGet>,
    #[serde(default)]
    tcp_socket: Option<TcpSocket>,
    #[serde(default)]
    exec: Option<Exec>,
    #[serde(default)]
    grpc: Option<Grpc>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpGet {
    #[serde(default)]
    path: Option<String>,
    port: u32,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    scheme: Option<String>,
    #[serde(default)]
    http_headers: Vec<Header>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TcpSocket {
    #[serde(default)]
    host: Option<String>,
    port: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Exec {
    #[serde(default)]
    command: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Grpc {
    port: u32,
    #[serde(default)]
    service: Option<String>,
}

/// What the probe runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// An HTTP GET, TCP connect or gRPC health check (`crate::probes`), at `host` (the
    /// proxy's first address when none).
    Check { check: Check, host: Option<String> },
    /// A command and its arguments, run without a shell as the agent's user.
    Exec(Vec<String>),
}

/// The VM health check: Envoy ready and `method` passing, judged over thresholds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthProbe {
    pub initial_delay: Duration,
    pub timeout: Duration,
    pub period: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
    pub method: Method,
}

const INPUT: &str = "ProxyConfig.readinessProbe";

fn port(field: &str, p: u32) -> Result<u16, ConfigError> {
    u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
        err(
            &format!("{INPUT}.{field}.port"),
            &p.to_string(),
            "a port 1-65535",
        )
    })
}

/// `0` is unset (Istio's defaults); a threshold is at least 1.
fn or(v: Option<u32>, default: u32) -> u32 {
    v.filter(|v| *v > 0).unwrap_or(default)
}

/// Parses ProxyConfig `readinessProbe` (its JSON form).
pub fn parse(value: &serde_json::Value) -> Result<HealthProbe, ConfigError> {
    let spec: Spec = serde_json::from_value(value.clone()).map_err(|e| {
        err(
            INPUT,
            &value.to_string(),
            &format!("a WorkloadGroup probe ({e})"),
        )
    })?;
    let methods = [
        spec.http_get.is_some(),
        spec.tcp_socket.is_some(),
        spec.exec.is_some(),
        spec.grpc.is_some(),
    ]
    .iter()
    .filter(|m| **m)
    .count();
    if methods != 1 {
        return Err(err(
            INPUT,
            &value.to_string(),
            "exactly one of httpGet, tcpSocket, exec or grpc",
        ));
    }
    let method = if let Some(h) = &spec.http_get {
        let tls = match h.scheme.as_deref().unwrap_or("") {
            "" | "HTTP" => false,
            "HTTPS" => true,
            other => {
                return Err(err(
                    &format!("{INPUT}.httpGet.scheme"),
                    other,
                    "HTTP or HTTPS",
                ));
            }
        };
        let path = h
            .path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        if !path.starts_with('/') {
            return Err(err(
                &format!("{INPUT}.httpGet.path"),
                &path,
                "a path starting with '/'",
            ));
        }
        for header in &h.http_headers {
            let ok = !header.name.is_empty()
                && header
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-');
            if !ok {
                return Err(err(
                    &format!("{INPUT}.httpGet.httpHeaders.name"),
                    &header.name,
                    "a header name of letters, digits and '-'",
                ));
            }
        }
        Method::Check {
            check: Check::Http {
                path,
                port: port("httpGet", h.port)?,
                headers: h
                    .http_headers
                    .iter()
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
                tls,
            },
            host: h.host.clone().filter(|h| !h.is_empty()),
        }
    } else if let Some(t) = &spec.tcp_socket {
        Method::Check {
            check: Check::Tcp {
                port: port("tcpSocket", t.port)?,
            },
            host: t.host.clone().filter(|h| !h.is_empty()),
        }
    } else if let Some(g) = &spec.grpc {
        Method::Check {
            check: Check::Grpc {
                port: port("grpc", g.port)?,
                service: g.service.clone().unwrap_or_default(),
            },
            host: None,
        }
    } else {
        let command = spec.exec.map(|e| e.command).unwrap_or_default();
        if command.is_empty() || command[0].is_empty() {
            return Err(err(
                &format!("{INPUT}.exec.command"),
                &format!("{command:?}"),
                "a command to run",
            ));
        }
        Method::Exec(command)
    };
    Ok(HealthProbe {
        initial_delay: Duration::from_secs(spec.initial_delay_seconds.unwrap_or(0).into()),
        timeout: Duration::from_secs(or(spec.timeout_seconds, 1).into()),
        period: Duration::from_secs(or(spec.period_seconds, 10).into()),
        success_threshold: or(spec.success_threshold, 1),
        failure_threshold: or(spec.failure_threshold, 1),
        method,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_vm_guides_probe_with_istios_defaults() {
        let p = parse(&json!({"periodSeconds": 5, "initialDelaySeconds": 1,
            "httpGet": {"port": 8080, "path": "/ready"}}))
        .unwrap();
        assert_eq!(p.period, Duration::from_secs(5));
        assert_eq!(p.initial_delay, Duration::from_secs(1));
        assert_eq!(p.timeout, Duration::from_secs(1));
        assert_eq!((p.success_threshold, p.failure_threshold), (1, 1));
        assert_eq!(
            p.method,
            Method::Check {
                check: Check::Http {
                    path: "/ready".into(),
                    port: 8080,
                    headers: vec![],
                    tls: false
                },
                host: None
            }
        );
        let p = parse(&json!({"tcpSocket": {"port": 22, "host": "10.0.0.9"}})).unwrap();
        assert_eq!(p.period, Duration::from_secs(10));
        assert_eq!(
            p.method,
            Method::Check {
                check: Check::Tcp { port: 22 },
                host: Some("10.0.0.9".into())
            }
        );
        assert_eq!(
            parse(&json!({"exec": {"command": ["/bin/true", "x"]}}))
                .unwrap()
                .method,
            Method::Exec(vec!["/bin/true".into(), "x".into()])
        );
    }

    #[test]
    fn malformed_probes_are_named() {
        for (probe, named) in [
            (json!({}), "exactly one of"),
            (
                json!({"httpGet": {"port": 80}, "tcpSocket": {"port": 80}}),
                "exactly one of",
            ),
            (json!({"httpGet": {"port": 0}}), "httpGet.port"),
            (json!({"httpGet": {"port": 70000}}), "httpGet.port"),
            (
                json!({"httpGet": {"port": 80, "scheme": "ftp"}}),
                "httpGet.scheme",
            ),
            (
                json!({"httpGet": {"port": 80, "httpHeaders": [{"name": "a_b", "value": "1"}]}}),
                "httpHeaders.name",
            ),
            (json!({"exec": {"command": []}}), "exec.command"),
            (
                json!({"httpGet": {"port": 80}, "periodSecond": 3}),
                "WorkloadGroup probe",
            ),
            (
                json!({"tcpSocket": {"port": 80}, "periodSeconds": -1}),
                "WorkloadGroup probe",
            ),
        ] {
            let e = parse(&probe).unwrap_err().to_string();
            assert!(e.contains(named), "{probe}: {e}");
        }
    }
}
