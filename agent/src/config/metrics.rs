//! ISTIO_PROMETHEUS_ANNOTATIONS: where the application serves the metrics 15020 merges (one
//! target, or since Istio 1.31 the `prometheus.istio.io/scrape-targets` list).

use serde::Deserialize;

/// One place the application serves metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub port: u16,
    pub path: String,
}

/// ISTIO_PROMETHEUS_ANNOTATIONS: where the application serves its metrics, in the order they
/// are merged (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppMetrics {
    pub targets: Vec<Target>,
}

#[derive(Deserialize)]
struct Annotations {
    #[serde(default)]
    scrape: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    port: Option<String>,
    /// Istio 1.31's injector writes `prometheus.istio.io/scrape-targets` here.
    #[serde(default)]
    targets: Option<Vec<TargetJson>>,
}

#[derive(Deserialize)]
struct TargetJson {
    #[serde(default)]
    port: Option<String>,
    #[serde(default)]
    path: Option<String>,
}

fn target(port: Option<&str>, path: Option<String>) -> Result<Target, String> {
    let port = match port {
        None | Some("") => 80,
        Some(p) => p
            .trim()
            .parse::<u16>()
            .map_err(|_| format!("port {p:?} is not a number"))?,
    };
    if port == 0 || super::ports::RESERVED.contains(&port) {
        return Err(format!("port {port} belongs to the proxy"));
    }
    let path = path
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/metrics".to_string());
    if !path.starts_with('/') || path.contains(char::is_whitespace) {
        return Err(format!(
            "path {path:?} must start with '/' and have no spaces"
        ));
    }
    Ok(Target { port, path })
}

/// Parses ISTIO_PROMETHEUS_ANNOTATIONS (`{"scrape":"true","path":"/metrics","port":"8080"}`,
/// with Istio 1.31 also `"targets":[{"port":"8080","path":"/metrics"},...]`, which then wins
/// over `port` and `path`, as in Istio's agent).
pub fn parse_app_metrics(json: &str) -> Result<Option<AppMetrics>, String> {
    let a: Annotations =
        serde_json::from_str(json).map_err(|e| format!("not a JSON object: {e}"))?;
    if a.scrape.as_deref() != Some("true") {
        return Ok(None);
    }
    let targets = match a.targets.filter(|t| !t.is_empty()) {
        Some(list) => list
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                target(t.port.as_deref(), t.path).map_err(|e| format!("targets[{i}]: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![target(a.port.as_deref(), a.path)?],
    };
    Ok(Some(AppMetrics { targets }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(port: u16, path: &str) -> AppMetrics {
        AppMetrics {
            targets: vec![Target {
                port,
                path: path.into(),
            }],
        }
    }

    #[test]
    fn app_annotations() {
        assert_eq!(
            parse_app_metrics(r#"{"scrape":"true","path":"/m","port":"9100"}"#).unwrap(),
            Some(one(9100, "/m"))
        );
        assert_eq!(parse_app_metrics(r#"{"scrape":"false"}"#).unwrap(), None);
        assert!(parse_app_metrics(r#"{"scrape":"true","port":"15090"}"#).is_err());
        assert!(parse_app_metrics(r#"{"scrape":"true","port":"x"}"#).is_err());
    }

    /// Istio 1.31's `prometheus.istio.io/scrape-targets` as its injector passes them on.
    #[test]
    fn scrape_targets() {
        let got = parse_app_metrics(
            r#"{"scrape":"true","path":"/a","port":"9100","targets":[{"port":"9100","path":"/a"},{"port":"9200","path":""}]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            got.targets,
            vec![
                Target {
                    port: 9100,
                    path: "/a".into()
                },
                Target {
                    port: 9200,
                    path: "/metrics".into()
                }
            ]
        );
        let e =
            parse_app_metrics(r#"{"scrape":"true","targets":[{"port":"9100"},{"port":"15021"}]}"#)
                .unwrap_err();
        assert!(e.contains("targets[1]") && e.contains("15021"), "{e}");
    }
}
