//! ISTIO_PROMETHEUS_ANNOTATIONS: where the application serves the metrics 15020 merges.

use serde::Deserialize;

/// ISTIO_PROMETHEUS_ANNOTATIONS: where the application serves its metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppMetrics {
    pub port: u16,
    pub path: String,
}

#[derive(Deserialize)]
struct Annotations {
    #[serde(default)]
    scrape: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    port: Option<String>,
}

/// Parses ISTIO_PROMETHEUS_ANNOTATIONS (`{"scrape":"true","path":"/metrics","port":"8080"}`).
pub fn parse_app_metrics(json: &str) -> Result<Option<AppMetrics>, String> {
    let a: Annotations =
        serde_json::from_str(json).map_err(|e| format!("not a JSON object: {e}"))?;
    if a.scrape.as_deref() != Some("true") {
        return Ok(None);
    }
    let port = match a.port.as_deref() {
        None | Some("") => 80,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("port {p:?} is not a number"))?,
    };
    if port == 0 || super::ports::RESERVED.contains(&port) {
        return Err(format!("port {port} belongs to the proxy"));
    }
    let path = a.path.unwrap_or_else(|| "/metrics".to_string());
    if !path.starts_with('/') || path.contains(char::is_whitespace) {
        return Err(format!(
            "path {path:?} must start with '/' and have no spaces"
        ));
    }
    Ok(Some(AppMetrics { port, path }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_annotations() {
        assert_eq!(
            parse_app_metrics(r#"{"scrape":"true","path":"/m","port":"9100"}"#).unwrap(),
            Some(AppMetrics {
                port: 9100,
                path: "/m".into()
            })
        );
        assert_eq!(parse_app_metrics(r#"{"scrape":"false"}"#).unwrap(), None);
        assert!(parse_app_metrics(r#"{"scrape":"true","port":"15090"}"#).is_err());
        assert!(parse_app_metrics(r#"{"scrape":"true","port":"x"}"#).is_err());
    }
}
