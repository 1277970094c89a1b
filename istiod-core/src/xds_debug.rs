//! What the control plane knows of each connected proxy's sync state, and the `istio.io/debug/*`
//! xDS types istioctl asks istiod for on an ADS stream (`istioctl proxy-status --xds-address`),
//! answered in istiod's shapes:
//! - `istio.io/debug/syncz`: one `envoy.service.status.v3.ClientConfig` per connected proxy (node
//!   id, metadata `CLUSTER_ID`/`NAMESPACE`/`ISTIO_VERSION`, and per watched type its status
//!   SYNCED/STALE/NOT_SENT/ERROR, when it was last sent and the last rejection);
//! - `istio.io/debug/config_dump` with one resource name, a proxy id (`POD.NAMESPACE`): what
//!   that proxy is sent now, as Envoy's admin `ConfigDump` sections in istiod's order (bootstrap,
//!   clusters, listeners, scoped routes, routes, secrets with their keys redacted, extension
//!   configs); nothing when that proxy is not connected here or not the caller's to see.
//!
//! Who may ask (istiod's `ENABLE_DEBUG_ENDPOINT_AUTH`, on by default in Istio 1.30+; always on
//! here): only a caller with a verified identity (a mesh client certificate, or a bearer token
//! over TLS); one of the root namespace sees every proxy, any other only its namespace's. A
//! stream that asks only debug types is no proxy: it is not listed, and gets no config.
//! The responses carry `control_plane.identifier` as istiod's do (`{"Component","ID","Info"}`:
//! istioctl's ISTIOD column).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use envoy_types::pb::envoy::admin::v3 as admin;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus, client_config};
use envoy_types::pb::google::protobuf::{Any, Struct, Timestamp, Value, value::Kind};
use prost::{Message, Name};
use tonic::Status;

use crate::model::Proxy;
use crate::resource::{
    CLUSTER_TYPE, EXTENSION_CONFIG_TYPE, LISTENER_TYPE, ROUTE_TYPE, SECRET_TYPE,
};
use crate::wire::Outgoing;

/// Every debug type starts so (istiod's `model.DebugType`).
pub const DEBUG_TYPE_PREFIX: &str = "istio.io/debug";
/// Each connected proxy's sync status.
pub const SYNCZ_TYPE: &str = "istio.io/debug/syncz";
/// One proxy's config as it is sent (resource name: the proxy id).
pub const CONFIG_DUMP_TYPE: &str = "istio.io/debug/config_dump";

/// Whether `type_url` is one of the debug types (answered here, never subscribed to).
pub fn is_debug(type_url: &str) -> bool {
    type_url.starts_with(DEBUG_TYPE_PREFIX)
}

/// One type's sync state with one proxy, as /debug/syncz shows it.
#[derive(Debug, Default, Clone, serde::Serialize, PartialEq, Eq)]
pub struct TypeSync {
    /// Version (snapshot) of the last response sent.
    pub sent: Option<String>,
    /// Version of the last response the proxy accepted.
    pub acked: Option<String>,
    /// Error detail of the last rejection, if the proxy ever rejected one.
    pub nacked: Option<String>,
    /// The EnvoyFilters (`namespace/name`) that patched what the proxy rejects now (cleared by
    /// its next ACK).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nacked_envoy_filters: Vec<String>,
    /// When the last response was sent.
    #[serde(skip)]
    pub sent_at: Option<SystemTime>,
    /// Whether the proxy's last answer was a rejection (its status is then ERROR until it
    /// accepts one).
    #[serde(skip)]
    pub rejecting: bool,
    /// The names the proxy subscribed to (what a config dump generates for it); empty for EDS,
    /// which a dump leaves out.
    #[serde(skip)]
    pub names: Vec<Arc<str>>,
}

impl TypeSync {
    /// istiod's status of one watched type: ERROR while the proxy rejects, NOT_SENT before
    /// anything was sent, SYNCED when the last sent is the last accepted, else STALE.
    pub fn status(&self) -> ConfigStatus {
        match (&self.sent, &self.acked) {
            _ if self.rejecting => ConfigStatus::Error,
            (None, _) => ConfigStatus::NotSent,
            (Some(sent), Some(acked)) if sent == acked => ConfigStatus::Synced,
            _ => ConfigStatus::Stale,
        }
    }
}

/// One connected proxy's sync state.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProxySync {
    pub proxy: String,
    pub delta: bool,
    pub types: BTreeMap<String, TypeSync>,
    /// The proxy as its node made it known.
    #[serde(skip)]
    pub node: Option<Arc<Proxy>>,
}

impl ProxySync {
    fn namespace(&self) -> Option<&str> {
        self.node.as_deref().map(|p| p.namespace.as_str())
    }
}

/// Which proxies a debug caller may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Viewer {
    /// In process, or an identity of the root namespace.
    All,
    /// An identity of another namespace: that namespace's proxies.
    Namespace(String),
}

impl Viewer {
    /// The viewer of a caller: `None` for one whose identity is not verified (refused:
    /// `Unauthenticated`, as istiod refuses it), else by its namespace.
    pub fn of(
        identity: Option<&mesh_common::identity::Identity>,
        in_process: bool,
        root_namespace: &str,
    ) -> Result<Viewer, Status> {
        if in_process {
            return Ok(Viewer::All);
        }
        match identity {
            Some(id) if id.namespace == root_namespace => Ok(Viewer::All),
            Some(id) => Ok(Viewer::Namespace(id.namespace.clone())),
            None => Err(Status::unauthenticated(
                "authentication required: istio.io/debug types need a verified identity (a mesh client certificate, or a bearer token over TLS)",
            )),
        }
    }

    fn sees(&self, sync: &ProxySync) -> bool {
        match self {
            Viewer::All => true,
            Viewer::Namespace(ns) => sync.namespace() == Some(ns.as_str()),
        }
    }
}

/// The responding control plane, as istiod's `control_plane.identifier` names itself.
pub fn identifier(id: &str) -> String {
    serde_json::json!({
        "Component": "istiod-core",
        "ID": id,
        "Info": {"version": env!("CARGO_PKG_VERSION"), "status": "Clean", "tag": env!("CARGO_PKG_VERSION")},
    })
    .to_string()
}

/// How a config dump generates a proxy's resources of a type for its subscribed names.
pub type Generate<'a> = &'a dyn Fn(&Proxy, &str, &[Arc<str>]) -> Option<Vec<Arc<Any>>>;

/// What a debug response is stamped with: the snapshot's version, the nonce and the control
/// plane's `identifier`.
pub struct Stamp<'a> {
    pub version: &'a str,
    pub nonce: &'a str,
    pub identifier: &'a str,
}

/// The answer to a debug request of `type_url` for `names` from `viewer`, `syncs` being every
/// connected proxy's state.
pub fn answer(
    type_url: &str,
    names: &[Arc<str>],
    viewer: &Viewer,
    syncs: &[ProxySync],
    stamp: Stamp<'_>,
    generate: Generate<'_>,
) -> Result<Outgoing, Status> {
    let resources = match type_url {
        SYNCZ_TYPE => syncz(viewer, syncs, SystemTime::now()),
        CONFIG_DUMP_TYPE => {
            let [name] = names else {
                return Err(Status::invalid_argument(format!(
                    "{CONFIG_DUMP_TYPE} takes one resource name, a proxy id (POD.NAMESPACE); got {}",
                    names.len()
                )));
            };
            proxy_config_dump(syncs, name, viewer, generate).unwrap_or_else(|| {
                tracing::info!(proxy = %name, "config_dump asked of a proxy not connected here (or not the caller's to see)");
                Vec::new()
            })
        }
        other => {
            return Err(Status::invalid_argument(format!(
                "unknown debug type {other:?}: {SYNCZ_TYPE} and {CONFIG_DUMP_TYPE} are served"
            )));
        }
    };
    let resources = resources.into_iter().map(Arc::new).collect();
    Ok(
        Outgoing::sotw(stamp.version, type_url, stamp.nonce, resources)
            .with_control_plane(stamp.identifier),
    )
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn any<M: Message + Name>(msg: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: msg.encode_to_vec(),
    }
}

/// The `ClientConfig` of each proxy `viewer` sees.
fn syncz(viewer: &Viewer, syncs: &[ProxySync], now: SystemTime) -> Vec<Any> {
    syncs
        .iter()
        .filter(|s| viewer.sees(s))
        .map(|s| any(&client_config(s, now)))
        .collect()
}

fn client_config(sync: &ProxySync, now: SystemTime) -> ClientConfig {
    let mut metadata = Struct::default();
    if let Some(node) = &sync.node {
        metadata
            .fields
            .insert("NAMESPACE".into(), string(&node.namespace));
        for key in ["CLUSTER_ID", "ISTIO_VERSION"] {
            if let Some(v) = node.metadata.get(key) {
                metadata.fields.insert(key.into(), string(v));
            }
        }
    }
    ClientConfig {
        node: Some(Node {
            id: sync.proxy.clone(),
            metadata: Some(metadata),
            ..Default::default()
        }),
        generic_xds_configs: sync
            .types
            .iter()
            .filter(|(t, _)| !is_debug(t))
            .map(|(type_url, t)| client_config::GenericXdsConfig {
                type_url: type_url.clone(),
                config_status: t.status() as i32,
                last_updated: t.sent_at.map(timestamp),
                error_state: t.nacked.as_ref().filter(|_| t.rejecting).map(|why| {
                    admin::UpdateFailureState {
                        last_update_attempt: Some(timestamp(now)),
                        details: why.clone(),
                        ..Default::default()
                    }
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The config dump of the connected proxy `proxy_id` (`POD.NAMESPACE`) if `viewer` may see it.
pub fn proxy_config_dump(
    syncs: &[ProxySync],
    proxy_id: &str,
    viewer: &Viewer,
    generate: Generate<'_>,
) -> Option<Vec<Any>> {
    let sync = syncs
        .iter()
        .find(|s| s.proxy == proxy_id && viewer.sees(s))?;
    Some(config_dump(sync, generate))
}

/// What `sync`'s proxy is sent now of each type it watches, as Envoy's admin config dump
/// sections in istiod's order.
fn config_dump(sync: &ProxySync, generate: Generate<'_>) -> Vec<Any> {
    let Some(proxy) = sync.node.as_deref() else {
        return Vec::new();
    };
    let of = |type_url: &str| -> Option<(String, Vec<Arc<Any>>)> {
        let t = sync.types.get(type_url)?;
        let version = t.sent.clone().unwrap_or_default();
        Some((version, generate(proxy, type_url, &t.names)?))
    };
    let mut out = vec![any(&admin::BootstrapConfigDump::default())];
    let clusters = of(CLUSTER_TYPE).map(|(version, resources)| admin::ClustersConfigDump {
        version_info: version.clone(),
        dynamic_active_clusters: resources
            .iter()
            .map(|c| admin::clusters_config_dump::DynamicCluster {
                version_info: version.clone(),
                cluster: Some((**c).clone()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    out.push(any(&clusters.unwrap_or_default()));
    let listeners = of(LISTENER_TYPE).map(|(version, resources)| admin::ListenersConfigDump {
        version_info: version.clone(),
        dynamic_listeners: resources
            .iter()
            .map(|l| admin::listeners_config_dump::DynamicListener {
                name: resource_name(l),
                active_state: Some(admin::listeners_config_dump::DynamicListenerState {
                    version_info: version.clone(),
                    listener: Some((**l).clone()),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    out.push(any(&listeners.unwrap_or_default()));
    out.push(any(&admin::ScopedRoutesConfigDump::default()));
    let routes = of(ROUTE_TYPE).map(|(version, resources)| admin::RoutesConfigDump {
        dynamic_route_configs: resources
            .iter()
            .map(|r| admin::routes_config_dump::DynamicRouteConfig {
                version_info: version.clone(),
                route_config: Some((**r).clone()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    out.push(any(&routes.unwrap_or_default()));
    let secrets = of(SECRET_TYPE).map(|(version, resources)| admin::SecretsConfigDump {
        dynamic_active_secrets: resources
            .iter()
            .map(|s| admin::secrets_config_dump::DynamicSecret {
                name: resource_name(s),
                version_info: version.clone(),
                secret: Some(redacted(s)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    out.push(any(&secrets.unwrap_or_default()));
    let ecds = of(EXTENSION_CONFIG_TYPE).map(|(version, resources)| admin::EcdsConfigDump {
        ecds_filters: resources
            .iter()
            .map(|f| admin::ecds_config_dump::EcdsFilterConfig {
                version_info: version.clone(),
                ecds_filter: Some((**f).clone()),
                ..Default::default()
            })
            .collect(),
    });
    out.push(any(&ecds.unwrap_or_default()));
    out
}

/// The `name` (field 1) of a Listener, Cluster or Secret.
fn resource_name(resource: &Any) -> String {
    #[derive(Clone, PartialEq, Message)]
    struct Named {
        #[prost(string, tag = "1")]
        name: String,
    }
    Named::decode(resource.value.as_slice())
        .map(|n| n.name)
        .unwrap_or_default()
}

/// A Secret with its private keys replaced by `[redacted]`, as istiod's dump shows it.
fn redacted(resource: &Any) -> Any {
    use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
    let Ok(mut secret) = Secret::decode(resource.value.as_slice()) else {
        return Any {
            type_url: resource.type_url.clone(),
            value: Vec::new(),
        };
    };
    if let Some(secret::Type::TlsCertificate(cert)) = &mut secret.r#type
        && cert.private_key.is_some()
    {
        cert.private_key = Some(DataSource {
            specifier: Some(Specifier::InlineString("[redacted]".into())),
            ..Default::default()
        });
    }
    any(&secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(id: &str) -> Arc<Proxy> {
        let mut p =
            Proxy::from_node_id(&format!("sidecar~10.0.0.1~{id}~svc.cluster.local")).unwrap();
        p.metadata.insert("CLUSTER_ID".into(), "Kubernetes".into());
        p.metadata.insert("ISTIO_VERSION".into(), "1.31.0".into());
        Arc::new(p)
    }

    fn sync(id: &str, types: &[(&str, TypeSync)]) -> ProxySync {
        ProxySync {
            proxy: id.into(),
            delta: false,
            types: types
                .iter()
                .map(|(t, s)| (t.to_string(), s.clone()))
                .collect(),
            node: Some(proxy(id)),
        }
    }

    fn state(sent: Option<&str>, acked: Option<&str>, rejecting: bool) -> TypeSync {
        TypeSync {
            sent: sent.map(Into::into),
            acked: acked.map(Into::into),
            nacked: rejecting.then(|| "bad".to_string()),
            rejecting,
            sent_at: sent.map(|_| SystemTime::UNIX_EPOCH),
            ..Default::default()
        }
    }

    #[test]
    fn status_is_istiods() {
        assert_eq!(state(None, None, false).status(), ConfigStatus::NotSent);
        assert_eq!(
            state(Some("2"), Some("2"), false).status(),
            ConfigStatus::Synced
        );
        assert_eq!(
            state(Some("3"), Some("2"), false).status(),
            ConfigStatus::Stale
        );
        assert_eq!(
            state(Some("3"), Some("2"), true).status(),
            ConfigStatus::Error
        );
        // A rejection long ago does not make a synced type an error.
        let mut t = state(Some("4"), Some("4"), false);
        t.nacked = Some("old".into());
        assert_eq!(t.status(), ConfigStatus::Synced);
    }

    #[test]
    fn viewers_need_an_identity_and_see_their_namespace() {
        let id = |ns: &str| mesh_common::identity::Identity {
            trust_domain: "cluster.local".into(),
            namespace: ns.into(),
            service_account: "default".into(),
        };
        let e = Viewer::of(None, false, "istio-system").unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert_eq!(Viewer::of(None, true, "istio-system").unwrap(), Viewer::All);
        assert_eq!(
            Viewer::of(Some(&id("istio-system")), false, "istio-system").unwrap(),
            Viewer::All
        );
        let viewer = Viewer::of(Some(&id("default")), false, "istio-system").unwrap();
        let syncs = [sync("a.default", &[]), sync("b.other", &[])];
        let seen: Vec<ClientConfig> = syncz(&viewer, &syncs, SystemTime::now())
            .iter()
            .map(|a| ClientConfig::decode(a.value.as_slice()).unwrap())
            .collect();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].node.as_ref().unwrap().id, "a.default");
        assert_eq!(syncz(&Viewer::All, &syncs, SystemTime::now()).len(), 2);
    }

    #[test]
    fn syncz_is_a_client_config_per_proxy_in_istiods_shape() {
        let syncs = [sync(
            "productpage-v1.default",
            &[
                (CLUSTER_TYPE, state(Some("7"), Some("7"), false)),
                (LISTENER_TYPE, state(Some("7"), Some("6"), true)),
                (ROUTE_TYPE, state(None, None, false)),
            ],
        )];
        let out = answer(
            SYNCZ_TYPE,
            &[],
            &Viewer::All,
            &syncs,
            Stamp {
                version: "7",
                nonce: "n-1",
                identifier: &identifier("istiod-core-0"),
            },
            &|_, _, _| None,
        )
        .unwrap();
        let resp: envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse =
            out.decode().unwrap();
        assert_eq!(resp.type_url, SYNCZ_TYPE);
        let id: serde_json::Value =
            serde_json::from_str(&resp.control_plane.unwrap().identifier).unwrap();
        assert_eq!(id["ID"], "istiod-core-0");
        assert_eq!(
            resp.resources[0].type_url,
            "type.googleapis.com/envoy.service.status.v3.ClientConfig"
        );
        let cc = ClientConfig::decode(resp.resources[0].value.as_slice()).unwrap();
        let node = cc.node.unwrap();
        assert_eq!(node.id, "productpage-v1.default");
        let md = node.metadata.unwrap().fields;
        assert_eq!(md["NAMESPACE"], string("default"));
        assert_eq!(md["CLUSTER_ID"], string("Kubernetes"));
        assert_eq!(md["ISTIO_VERSION"], string("1.31.0"));
        let by_type: BTreeMap<&str, &client_config::GenericXdsConfig> = cc
            .generic_xds_configs
            .iter()
            .map(|g| (g.type_url.as_str(), g))
            .collect();
        assert_eq!(
            by_type[CLUSTER_TYPE].config_status,
            ConfigStatus::Synced as i32
        );
        assert!(by_type[CLUSTER_TYPE].last_updated.is_some());
        assert_eq!(
            by_type[LISTENER_TYPE].config_status,
            ConfigStatus::Error as i32
        );
        assert_eq!(
            by_type[LISTENER_TYPE].error_state.as_ref().unwrap().details,
            "bad"
        );
        assert_eq!(
            by_type[ROUTE_TYPE].config_status,
            ConfigStatus::NotSent as i32
        );
    }

    #[test]
    fn config_dump_is_istiods_seven_sections_of_what_the_proxy_is_sent() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
            Secret, TlsCertificate, secret,
        };
        let mut rds = state(Some("7"), Some("7"), false);
        rds.names = vec!["9080".into()];
        let syncs = [sync(
            "productpage-v1.default",
            &[
                (CLUSTER_TYPE, state(Some("7"), Some("7"), false)),
                (ROUTE_TYPE, rds),
                (SECRET_TYPE, state(Some("7"), Some("7"), false)),
            ],
        )];
        let cluster = Cluster {
            name: "outbound|9080||reviews.default.svc.cluster.local".into(),
            ..Default::default()
        };
        let key = Secret {
            name: "kubernetes://cert".into(),
            r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
                private_key: Some(Default::default()),
                ..Default::default()
            })),
        };
        let generate = |_: &Proxy, t: &str, names: &[Arc<str>]| -> Option<Vec<Arc<Any>>> {
            match t {
                CLUSTER_TYPE => Some(vec![Arc::new(any(&cluster))]),
                ROUTE_TYPE => {
                    assert_eq!(names, [Arc::<str>::from("9080")]);
                    Some(Vec::new())
                }
                _ => Some(vec![Arc::new(any(&key))]),
            }
        };
        let asked = |name: &str, viewer: &Viewer| -> Vec<Any> {
            answer(
                CONFIG_DUMP_TYPE,
                &[name.into()],
                viewer,
                &syncs,
                Stamp {
                    version: "7",
                    nonce: "n",
                    identifier: "{}",
                },
                &generate,
            )
            .unwrap()
            .decode::<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>()
            .unwrap()
            .resources
        };
        let dump = asked("productpage-v1.default", &Viewer::All);
        let types: Vec<&str> = dump
            .iter()
            .map(|a| a.type_url.rsplit('.').next().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "BootstrapConfigDump",
                "ClustersConfigDump",
                "ListenersConfigDump",
                "ScopedRoutesConfigDump",
                "RoutesConfigDump",
                "SecretsConfigDump",
                "EcdsConfigDump"
            ]
        );
        let clusters = admin::ClustersConfigDump::decode(dump[1].value.as_slice()).unwrap();
        assert_eq!(clusters.version_info, "7");
        let c = clusters.dynamic_active_clusters[0]
            .cluster
            .as_ref()
            .unwrap();
        assert_eq!(Cluster::decode(c.value.as_slice()).unwrap(), cluster);
        let secrets = admin::SecretsConfigDump::decode(dump[5].value.as_slice()).unwrap();
        let s = &secrets.dynamic_active_secrets[0];
        assert_eq!(s.name, "kubernetes://cert");
        let Some(secret::Type::TlsCertificate(cert)) =
            Secret::decode(s.secret.as_ref().unwrap().value.as_slice())
                .unwrap()
                .r#type
        else {
            panic!("not a certificate");
        };
        assert_eq!(
            cert.private_key.unwrap().specifier,
            Some(
                envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(
                    "[redacted]".into()
                )
            )
        );
        // Not connected here, or not the caller's namespace: nothing.
        assert!(asked("details-v1.default", &Viewer::All).is_empty());
        assert!(asked("productpage-v1.default", &Viewer::Namespace("other".into())).is_empty());
        // Not one name: refused.
        let e = answer(
            CONFIG_DUMP_TYPE,
            &[],
            &Viewer::All,
            &syncs,
            Stamp {
                version: "7",
                nonce: "n",
                identifier: "{}",
            },
            &generate,
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
