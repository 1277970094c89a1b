//! ISTIO_KUBE_APP_PROBERS: the app probes the injector rewrote to 15020, parsed into the checks
//! `crate::probes` runs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// A port given as a number (or a numeric string, as the injector may write it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
enum PortSpec {
    Number(u16),
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct Header {
    name: String,
    value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HttpGetSpec {
    #[serde(default)]
    path: Option<String>,
    port: PortSpec,
    #[serde(default)]
    scheme: Option<String>,
    #[serde(default)]
    http_headers: Vec<Header>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct PortOnly {
    port: PortSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct GrpcSpec {
    port: PortSpec,
    #[serde(default)]
    service: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProbeSpec {
    #[serde(default)]
    http_get: Option<HttpGetSpec>,
    #[serde(default)]
    tcp_socket: Option<PortOnly>,
    #[serde(default)]
    grpc: Option<GrpcSpec>,
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

/// One rewritten probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Http {
        path: String,
        port: u16,
        headers: Vec<(String, String)>,
        /// HTTPS: TLS without certificate verification, as kubelet probes.
        tls: bool,
    },
    Tcp {
        port: u16,
    },
    Grpc {
        port: u16,
        service: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub check: Check,
    pub timeout: Duration,
}

fn port(p: &PortSpec, key: &str) -> Result<u16, String> {
    let n = match p {
        PortSpec::Number(n) => *n,
        PortSpec::Text(t) => t.parse().map_err(|_| {
            format!("{key}: port {t:?} is not a number (named ports must be resolved)")
        })?,
    };
    if n == 0 || super::ports::RESERVED.contains(&n) {
        return Err(format!(
            "{key}: port {n} is not allowed (0 or a port of the proxy)"
        ));
    }
    Ok(n)
}

/// Parses ISTIO_KUBE_APP_PROBERS: a JSON object of `/app-health/...` or `/app-lifecycle/...` paths.
pub fn parse(json: &str) -> Result<BTreeMap<String, Probe>, String> {
    let raw: BTreeMap<String, ProbeSpec> =
        serde_json::from_str(json).map_err(|e| format!("not a JSON object of probes: {e}"))?;
    let mut out = BTreeMap::new();
    for (key, spec) in raw {
        if !(key.starts_with("/app-health/") || key.starts_with("/app-lifecycle/")) {
            return Err(format!(
                "{key}: expected a path under /app-health/ or /app-lifecycle/"
            ));
        }
        let check = match (&spec.http_get, &spec.tcp_socket, &spec.grpc) {
            (Some(h), None, None) => {
                let tls = match h.scheme.as_deref().map(str::to_ascii_uppercase).as_deref() {
                    None | Some("HTTP") => false,
                    Some("HTTPS") => true,
                    Some(other) => {
                        return Err(format!("{key}: scheme {other:?} (expected HTTP or HTTPS)"));
                    }
                };
                let path = h.path.clone().unwrap_or_else(|| "/".to_string());
                if !path.starts_with('/') {
                    return Err(format!("{key}: path {path:?} must start with '/'"));
                }
                Check::Http {
                    path,
                    port: port(&h.port, &key)?,
                    headers: h
                        .http_headers
                        .iter()
                        .map(|h| (h.name.clone(), h.value.clone()))
                        .collect(),
                    tls,
                }
            }
            (None, Some(t), None) => Check::Tcp {
                port: port(&t.port, &key)?,
            },
            (None, None, Some(g)) => Check::Grpc {
                port: port(&g.port, &key)?,
                service: g.service.clone().unwrap_or_default(),
            },
            _ => {
                return Err(format!(
                    "{key}: expected exactly one of httpGet, tcpSocket, grpc"
                ));
            }
        };
        let timeout = Duration::from_secs(spec.timeout_seconds.unwrap_or(1).clamp(1, 60));
        out.insert(key, Probe { check, timeout });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_injector_format() {
        let p = parse(
            r#"{"/app-health/web/livez":{"httpGet":{"path":"/healthz","port":8080,"scheme":"HTTP"},"timeoutSeconds":2},
                "/app-health/web/readyz":{"tcpSocket":{"port":"8081"}},
                "/app-health/web/startupz":{"grpc":{"port":9000}}}"#,
        )
        .unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p["/app-health/web/livez"].timeout, Duration::from_secs(2));
        assert_eq!(p["/app-health/web/readyz"].check, Check::Tcp { port: 8081 });
    }

    #[test]
    fn rejects_bad_probes() {
        for bad in [
            r#"{"/other":{"tcpSocket":{"port":80}}}"#,
            r#"{"/app-health/a/livez":{"tcpSocket":{"port":15020}}}"#,
            r#"{"/app-health/a/livez":{"tcpSocket":{"port":"http"}}}"#,
            r#"{"/app-health/a/livez":{"httpGet":{"port":80,"scheme":"FTP"}}}"#,
            r#"{"/app-health/a/livez":{}}"#,
            r#"[1]"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
