//! The extension provider a Telemetry names, as a proxy reaches it: its MeshConfig entry (or
//! Istio's built-in `envoy`), and for one with a service, that service's outbound cluster.

use crate::config_store::providers::{self, ExtensionProvider, FileAccessLog, without_namespace};
use crate::push_context::PushContext;

/// A provider as a proxy reaches it: its MeshConfig entry and, for one with a service, that
/// service's host and outbound cluster (`None` when the service is not in the mesh).
pub struct Resolved<'a> {
    pub provider: &'a ExtensionProvider,
    pub host: Option<String>,
    pub cluster: Option<String>,
}

/// Istio's built-in `envoy` provider: a file logger to `/dev/stdout`.
fn builtin_envoy() -> &'static ExtensionProvider {
    static ENVOY: std::sync::OnceLock<ExtensionProvider> = std::sync::OnceLock::new();
    ENVOY.get_or_init(|| ExtensionProvider {
        name: "envoy".into(),
        envoy_file_access_log: Some(FileAccessLog {
            path: "/dev/stdout".into(),
            log_format: None,
        }),
        ..Default::default()
    })
}

/// The provider named `name` (case-insensitively, as Istio), with its service resolved.
pub fn resolve<'a>(push: &'a PushContext, name: &str) -> Option<Resolved<'a>> {
    let provider = providers::find(&push.mesh.extension_providers, name)
        .or_else(|| name.eq_ignore_ascii_case("envoy").then(builtin_envoy))?;
    let target = provider.telemetry_service();
    let (host, cluster) = match target {
        Some((service, port)) => {
            let host = without_namespace(service);
            match (push.service(host), u16::try_from(port)) {
                (Some(_), Ok(port)) => (
                    Some(host.to_string()),
                    Some(crate::model::outbound_cluster_name(port, host)),
                ),
                _ => (None, None),
            }
        }
        None => (None, None),
    };
    Some(Resolved {
        provider,
        host,
        cluster,
    })
}
