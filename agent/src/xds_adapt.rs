//! Adapts a remote istiod's xDS for upstream Envoy. istiod (1.24–1.28) puts extensions into
//! sidecar listeners and clusters that exist only in Istio's Envoy build (istio/proxy), and an
//! upstream Envoy rejects every resource carrying one ("Didn't find a registered
//! implementation"). This step, between the control plane and Envoy, removes them from LDS, CDS
//! and ECDS responses (state of the world and Delta):
//!
//! - `istio.metadata_exchange`: the HTTP filter (a TypedStruct of
//!   `io.istio.http.peer_metadata.Config`, istio `pilot/pkg/xds/filters` Sidecar*MetadataFilter),
//!   the network and cluster filter (`envoy.tcp.metadataexchange.config.MetadataExchange`,
//!   `TCPListenerMx`/`TCPClusterMx`, a TypedStruct, or the message itself in older istiods);
//! - `istio.alpn` (`istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig`);
//! - `istio.stats` (`stats.PluginConfig`, istio `pilot/pkg/networking/core/extension/telemetry`),
//!   HTTP and network filter;
//! - ALPN `istio-peer-exchange` in the Downstream/UpstreamTlsContext of filter chains and clusters
//!   (with the metadata-exchange filter gone, a peer that negotiated it would write exchange
//!   bytes into the application's stream);
//! - `istio_authn` (`io.istio.network.authn.Config`, istiod 1.17–1.19 inbound chains), which
//!   put the peer's SPIFFE URI SAN in the filter state `io.istio.peer_principal` for RBAC
//!   principals to match. Those principals (in the HTTP and network RBAC filters of the same
//!   listeners) become `authenticated.principal_name` with the same matcher: what istiod itself
//!   went back to for sidecars in 1.20 (istio/istio#47395), matched by upstream Envoy against the
//!   verified peer certificate's URI SAN. So no principal of a DENY policy stops matching;
//! - whole listeners that need Istio's HBONE filters (`istio.set_internal_dst_address`,
//!   `io.istio.http.connect_authority`, `connect_baggage`: `connect_originate`,
//!   `connect_terminate`, `main_internal` of istiod 1.18+ with HBONE on). Without them HBONE
//!   tunnels to and from this proxy are refused (port 15008 is not served); plain and mTLS
//!   traffic is not affected.
//!
//! Where `istio.stats` is removed, Istio's standard metrics would vanish with it: the connection
//! manager or tcp_proxy it measured gets the agent's access logger instead (the one istiod-core
//! gives every listener, `istiod_core::generators::telemetry`), reporting as the listener's
//! traffic direction says, so `istio_requests_total` and the rest still come from the agent.
//!
//! The messages are edited at the wire level (`wire`): everything not removed is kept byte for
//! byte, fields unknown to our generated types included. A response with nothing to remove is
//! found by a scan of its bytes and forwarded as it came.
//!
//! A removed filter that carries settings beyond what istiod writes for it (an EnvoyFilter MERGE
//! into `istio.stats` or `istio.alpn`, an EnvoyFilter that adds an Istio-only filter) loses them
//! with it: the agent logs them by name and lists them in `/debug/xds_adapt` (`lost`).
//!
//! Security filters (RBAC, jwt_authn, ext_authz) are never dropped: one whose type upstream Envoy
//! cannot load makes the agent NACK the response to the control plane (Envoy keeps its last good
//! config). Other unknown types are kept and reported by name (Envoy then rejects the resource).

mod lost;
mod wire;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use mesh_common::telemetry::{
    MetricConfig, MetricsPlan, Reporter, http_access_log, peer, tcp_access_log,
    tcp_access_log_options,
};
use prost::Message;
use wire::Edit;
pub use wire::WireError;

/// The HTTP router filter's name, as istiod writes it.
const ROUTER_FILTER: &str = "envoy.filters.http.router";

pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const EXTENSION_CONFIG_TYPE: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";

/// The Istio-only extension types removed, as Envoy looks them up (a TypedStruct's inner type).
pub const PEER_METADATA: &str = "io.istio.http.peer_metadata.Config";
pub const TCP_METADATA_EXCHANGE: &str = "envoy.tcp.metadataexchange.config.MetadataExchange";
pub const ALPN_OVERRIDE: &str = "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig";
pub const ISTIO_STATS: &str = "stats.PluginConfig";
/// istiod up to 1.11 wrote metadata exchange and stats as Wasm filters of plugins compiled into
/// istio-proxy (the null VM); no upstream Envoy has them. Reported as `null-vm:<plugin>`.
pub const NULL_VM_METADATA_EXCHANGE: &str = "null-vm:envoy.wasm.metadata_exchange";
pub const NULL_VM_STATS: &str = "null-vm:envoy.wasm.stats";
/// The network filter `istio_authn` of istiod 1.17–1.19.
pub const PEER_AUTHN: &str = "io.istio.network.authn.Config";
const ISTIO_ONLY: [&str; 7] = [
    PEER_METADATA,
    TCP_METADATA_EXCHANGE,
    ALPN_OVERRIDE,
    ISTIO_STATS,
    NULL_VM_METADATA_EXCHANGE,
    NULL_VM_STATS,
    PEER_AUTHN,
];
/// Filters only Istio's HBONE listeners use: a listener with one is removed whole.
pub const HBONE_ONLY: [&str; 3] = [
    "istio.set_internal_dst_address.v1.Config",
    "io.istio.http.connect_authority.Config",
    "io.istio.http.connect_baggage.Config",
];
/// The filter state `istio_authn` set, and RBAC principals of istiod 1.17–1.19 matched.
const PEER_PRINCIPAL_KEY: &[u8] = b"io.istio.peer_principal";
const RBAC_FILTERS: [&str; 2] = [
    "envoy.extensions.filters.http.rbac.v3.RBAC",
    "envoy.extensions.filters.network.rbac.v3.RBAC",
];
const WASM_FILTERS: [&str; 2] = [
    "envoy.extensions.filters.http.wasm.v3.Wasm",
    "envoy.extensions.filters.network.wasm.v3.Wasm",
];
const NULL_VM: &str = "envoy.wasm.runtime.null";

/// The ALPN istio-proxy peers negotiate for TCP metadata exchange.
pub const PEER_EXCHANGE_ALPN: &str = "istio-peer-exchange";

/// Filters that enforce policy: never removed.
const SECURITY_FILTERS: [&str; 5] = [
    "envoy.filters.http.rbac",
    "envoy.filters.http.jwt_authn",
    "envoy.filters.http.ext_authz",
    "envoy.filters.network.rbac",
    "envoy.filters.network.ext_authz",
];

const HCM: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY: &str = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const DOWNSTREAM_TLS: &str = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM_TLS: &str = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";
const TYPED_STRUCTS: [&str; 2] = ["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"];
const TYPE_PREFIX: &[u8] = b"type.googleapis.com/";

/// `udpa.type.v1.TypedStruct` / `xds.type.v3.TypedStruct` (the same fields), how istiod wraps the
/// Istio-only extensions' configs. The adapter reads them on the wire; the tests and the bench
/// build and decode them with this one definition.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypedStruct {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<envoy_types::pb::google::protobuf::Struct>,
}

/// The name a type URL ends with (`type.googleapis.com/x.y.Z` → `x.y.Z`).
fn type_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// A type upstream Envoy has: its own API, protobuf's well-known types, xDS's shared types.
fn loadable(name: &str) -> bool {
    (name.starts_with("envoy.") && !name.starts_with("envoy.tcp.metadataexchange."))
        || name.starts_with("google.protobuf.")
        || name.starts_with("xds.")
        || name.starts_with("udpa.")
}

fn istio_only(name: &str) -> bool {
    ISTIO_ONLY.contains(&name)
}

/// Whether `msg` may carry something to adapt: `istio-peer-exchange`, the null VM, RBAC on
/// `io.istio.peer_principal`, or an Any type URL
/// outside Envoy's own API. A response whose every `type.googleapis.com/` names an Envoy or
/// well-known type and that has no such ALPN is forwarded untouched without being decoded.
pub fn needs_adapting(msg: &[u8]) -> bool {
    if memchr::memmem::find(msg, PEER_EXCHANGE_ALPN.as_bytes()).is_some()
        || memchr::memmem::find(msg, NULL_VM.as_bytes()).is_some()
        || memchr::memmem::find(msg, PEER_PRINCIPAL_KEY).is_some()
    {
        return true;
    }
    memchr::memmem::find_iter(msg, TYPE_PREFIX).any(|at| {
        let rest = msg.get(at + TYPE_PREFIX.len()..).unwrap_or_default();
        let plain = [&b"envoy."[..], b"google.protobuf.", b"xds.", b"udpa."]
            .iter()
            .any(|p| rest.starts_with(p))
            && !rest.starts_with(b"envoy.tcp.metadataexchange.");
        !plain
    })
}

/// One extension seen in a resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Finding {
    /// The listener, cluster or extension config it is in.
    pub resource: String,
    /// The filter's name.
    pub filter: String,
    /// The type Envoy would look up.
    #[serde(rename = "type")]
    pub type_name: String,
}

/// What one response held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    pub removed: Vec<Finding>,
    /// Security filters of a type Envoy cannot load: the response is refused.
    pub refused: Vec<Finding>,
    /// Other types Envoy cannot load, kept (Envoy rejects the resource).
    pub unknown: Vec<Finding>,
    /// Resources whose `istio-peer-exchange` ALPN was removed.
    pub alpn_stripped: Vec<String>,
    /// Listeners where a removed `istio.stats` was replaced by the agent's access logger
    /// (`with_standard_metrics`), one entry per connection manager or tcp_proxy.
    pub metrics_added: Vec<String>,
    /// Resources whose RBAC principals on `io.istio.peer_principal` became `authenticated`.
    pub principals_rewritten: Vec<String>,
    /// Removed filters that carried settings beyond istiod's own (an EnvoyFilter patch on them):
    /// the filter, and the settings lost with it (`lost`).
    pub settings_lost: Vec<(Finding, Vec<String>)>,
}

/// The editing of one response: the resource being walked and what was found.
#[derive(Default)]
struct Pass {
    resource: String,
    /// The resource needs an HBONE filter: it is removed whole.
    drop_resource: bool,
    /// Delta resources removed whole for that reason: Envoy is told to remove them, in case an
    /// earlier version of one (without HBONE filters) reached it.
    dropped: Vec<String>,
    found: Findings,
    /// How the listener being walked reports Istio's metrics (its traffic direction).
    reporter: Option<Reporter>,
    /// Whether an `istio.stats` network filter was removed from the filter chain being walked.
    chain_lost_tcp_stats: bool,
    /// The metrics' shape (Telemetry overrides) of the `istio.stats` removed last.
    stats_plan: MetricsPlan,
}

/// Istio's `stats.PluginConfig` (istio/api `envoy/extensions/stats/config.proto`) as the shape
/// of the agent's metrics: `metrics` (8) MetricConfigs with `dimensions` (1, a map), `name`
/// (2), `tags_to_remove` (3) and `drop` (5); `tcp_reporting_duration` (7).
fn stats_plan(config: &[u8]) -> Result<MetricsPlan, WireError> {
    let mut plan = MetricsPlan::default();
    for m in wire::repeated(config, 8)? {
        let mut shape = MetricConfig {
            name: wire::string_field(m, 2)?.to_string(),
            ..MetricConfig::default()
        };
        for field in wire::fields(m) {
            let field = field?;
            match (field.number, field.is_len()) {
                (1, true) => {
                    let key = wire::string_field(field.value, 1)?;
                    let value = wire::string_field(field.value, 2)?;
                    shape.dimensions.insert(key.to_string(), value.to_string());
                }
                (3, true) => shape.tags_to_remove.push(
                    std::str::from_utf8(field.value)
                        .unwrap_or_default()
                        .to_string(),
                ),
                (5, false) => shape.drop = field.varint().unwrap_or(0) != 0,
                _ => {}
            }
        }
        plan.metrics.push(shape);
    }
    if let Some(d) = wire::len_field(config, 7)? {
        let mut seconds = 0u64;
        let mut nanos = 0u32;
        for field in wire::fields(d) {
            let field = field?;
            match field.number {
                1 => seconds = field.varint().unwrap_or(0),
                2 => nanos = u32::try_from(field.varint().unwrap_or(0)).unwrap_or(0),
                _ => {}
            }
        }
        plan.reporting_interval = Some(std::time::Duration::new(seconds, nanos));
    }
    Ok(plan)
}

/// The reporter of a listener: its `traffic_direction` (16: INBOUND 1, OUTBOUND 2), else
/// Istio's inbound listener name, else outbound (`source`).
fn listener_reporter(listener: &[u8]) -> Result<Reporter, WireError> {
    for field in wire::fields(listener) {
        let field = field?;
        if field.number == 16 {
            match field.varint() {
                Some(1) => return Ok(Reporter::Destination),
                Some(2) => return Ok(Reporter::Source),
                _ => {}
            }
        }
    }
    Ok(if wire::string_field(listener, 1)? == "virtualInbound" {
        Reporter::Destination
    } else {
        Reporter::Source
    })
}

enum Decision {
    Keep,
    Remove,
    Refuse,
}

/// Which of a filter message's fields hold what: listener, HTTP and cluster filters differ.
struct FilterShape {
    typed_config: u32,
    config_discovery: u32,
    is_optional: Option<u32>,
}

const NETWORK_FILTER: FilterShape = FilterShape {
    typed_config: 4,
    config_discovery: 5,
    is_optional: None,
};
const HTTP_FILTER: FilterShape = FilterShape {
    typed_config: 4,
    config_discovery: 5,
    is_optional: Some(6),
};
const CLUSTER_FILTER: FilterShape = FilterShape {
    typed_config: 2,
    config_discovery: 3,
    is_optional: None,
};
const LISTENER_FILTER: FilterShape = FilterShape {
    typed_config: 3,
    config_discovery: 5,
    is_optional: None,
};

/// An RBAC principal (config.rbac.v3.Principal) with every `filter_state` match on
/// `io.istio.peer_principal` (12: key 1, string_match 2) turned into
/// `authenticated` (4) `{ principal_name (2): the same StringMatcher }`, through `and_ids` (1),
/// `or_ids` (2) (Set.ids 1) and `not_id` (8).
fn rewrite_principal(principal: &[u8]) -> Edited {
    wire::rewrite(principal, |f| {
        if !f.is_len() {
            return Ok(Edit::Keep);
        }
        match f.number {
            1 | 2 => {
                let set = wire::rewrite(f.value, |id| {
                    if id.number != 1 || !id.is_len() {
                        return Ok(Edit::Keep);
                    }
                    Ok(rewrite_principal(id.value)?.map_or(Edit::Keep, Edit::Replace))
                })?;
                Ok(set.map_or(Edit::Keep, Edit::Replace))
            }
            8 => Ok(rewrite_principal(f.value)?.map_or(Edit::Keep, Edit::Replace)),
            12 if wire::len_field(f.value, 1)? == Some(PEER_PRINCIPAL_KEY) => {
                let Some(matcher) = wire::len_field(f.value, 2)? else {
                    return Ok(Edit::Keep);
                };
                let mut authenticated = Vec::new();
                wire::put_len(&mut authenticated, 2, matcher);
                Ok(Edit::Renumber(4, authenticated))
            }
            _ => Ok(Edit::Keep),
        }
    })
}

/// A message, or `None` when unchanged.
type Edited = Result<Option<Vec<u8>>, WireError>;

/// `msg` with each length-delimited field `number` edited by `inner`.
fn rewrite_field(msg: &[u8], number: u32, inner: &dyn Fn(&[u8]) -> Edited) -> Edited {
    wire::rewrite(msg, |f| {
        if f.number != number || !f.is_len() {
            return Ok(Edit::Keep);
        }
        Ok(inner(f.value)?.map_or(Edit::Keep, Edit::Replace))
    })
}

/// An HTTP or network RBAC filter config (rules 1, shadow_rules 2 → config.rbac.v3.RBAC:
/// policies 2, map entries with the Policy in 2 → principals 2) with its principals rewritten.
fn rewrite_rbac(rbac: &[u8]) -> Edited {
    let policy = |p: &[u8]| rewrite_field(p, 2, &rewrite_principal);
    let entry = |e: &[u8]| rewrite_field(e, 2, &policy);
    let rules = |r: &[u8]| rewrite_field(r, 2, &entry);
    let shadow = rewrite_field(rbac, 2, &rules)?;
    let both = rewrite_field(shadow.as_deref().unwrap_or(rbac), 1, &rules)?;
    Ok(both.or(shadow))
}

/// The type Envoy looks an Any up by: its own, or a TypedStruct's inner one; for a Wasm filter of
/// the null VM, `null-vm:<plugin>` (Envoy cannot load it whatever the plugin).
fn extension_type(any: &[u8]) -> Result<String, WireError> {
    let name = type_name(wire::string_field(any, 1)?);
    if WASM_FILTERS.contains(&name) {
        // Wasm.config (1) → PluginConfig.vm_config (3) → VmConfig: runtime (2), code (3) →
        // AsyncDataSource.local (1) → DataSource.inline_string (3).
        let wasm = wire::len_field(any, 2)?.unwrap_or_default();
        let plugin = wire::len_field(wasm, 1)?.unwrap_or_default();
        let vm = wire::len_field(plugin, 3)?.unwrap_or_default();
        if wire::string_field(vm, 2)? == NULL_VM {
            let code = wire::len_field(vm, 3)?.unwrap_or_default();
            let local = wire::len_field(code, 1)?.unwrap_or_default();
            return Ok(format!("null-vm:{}", wire::string_field(local, 3)?));
        }
    }
    if TYPED_STRUCTS.contains(&name) {
        let value = wire::len_field(any, 2)?.unwrap_or_default();
        return Ok(type_name(wire::string_field(value, 1)?).to_string());
    }
    Ok(name.to_string())
}

impl Pass {
    /// Whether Istio's stats filter (either form) is among the removals from the `from`th on.
    fn removed_stats_since(&self, from: usize) -> bool {
        self.found
            .removed
            .iter()
            .skip(from)
            .any(|f| f.type_name == ISTIO_STATS || f.type_name == NULL_VM_STATS)
    }

    fn finding(&self, filter: &str, type_name: &str) -> Finding {
        Finding {
            resource: self.resource.clone(),
            filter: filter.to_string(),
            type_name: type_name.to_string(),
        }
    }

    /// Judges one filter by the types it names (its typed_config, or the type_urls of its
    /// config_discovery): all loadable, kept; all Istio-only, removed; a security filter with a
    /// type Envoy lacks, refused; anything else unknown, kept and reported.
    fn judge(&mut self, filter: &[u8], shape: &FilterShape) -> Result<Decision, WireError> {
        let name = wire::string_field(filter, 1)?;
        let mut types = Vec::new();
        let mut optional = false;
        let mut typed_config = None;
        for field in wire::fields(filter) {
            let field = field?;
            if field.number == shape.typed_config && field.is_len() {
                typed_config = Some(field.value);
                let t = extension_type(field.value)?;
                if t == ISTIO_STATS {
                    // Any.value (2): the stats.PluginConfig.
                    let config = wire::len_field(field.value, 2)?.unwrap_or_default();
                    self.stats_plan = stats_plan(config)?;
                }
                types.push(t);
            } else if field.number == shape.config_discovery && field.is_len() {
                for url in wire::repeated(field.value, 4)? {
                    types.push(type_name(std::str::from_utf8(url).unwrap_or_default()).to_string());
                }
            } else if Some(field.number) == shape.is_optional {
                optional = field.varint().unwrap_or(0) != 0;
            }
        }
        if types.iter().all(|t| loadable(t)) {
            return Ok(Decision::Keep);
        }
        if let Some(t) = types.iter().find(|t| HBONE_ONLY.contains(&t.as_str())) {
            self.drop_resource = true;
            self.found.removed.push(self.finding(name, t));
            return Ok(Decision::Keep);
        }
        if SECURITY_FILTERS.contains(&name) {
            for t in types.iter().filter(|t| !loadable(t)) {
                self.found.refused.push(self.finding(name, t));
            }
            return Ok(Decision::Refuse);
        }
        if types.iter().all(|t| istio_only(t)) {
            for t in &types {
                self.found.removed.push(self.finding(name, t));
                if let Some(any) = typed_config {
                    let lost = lost::settings(t, any);
                    if !lost.is_empty() {
                        self.found.settings_lost.push((self.finding(name, t), lost));
                    }
                }
            }
            return Ok(Decision::Remove);
        }
        if !optional {
            for t in types.iter().filter(|t| !loadable(t)) {
                self.found.unknown.push(self.finding(name, t));
            }
        }
        Ok(Decision::Keep)
    }

    /// Removes the Istio-only HTTP filters of an HttpConnectionManager (`istio.metadata_exchange`,
    /// `istio.alpn`, `istio.stats`). Where `istio.stats` is removed from an HCM, this is the place
    /// a replacement for its metrics belongs.
    fn strip_http_filters(&mut self, hcm: &[u8]) -> Result<Option<Vec<u8>>, WireError> {
        let removed_before = self.found.removed.len();
        let edited = wire::rewrite(hcm, |field| {
            if field.number != 5 || !field.is_len() {
                return Ok(Edit::Keep);
            }
            Ok(match self.judge(field.value, &HTTP_FILTER)? {
                Decision::Remove => Edit::Drop,
                Decision::Refuse => Edit::Keep,
                Decision::Keep => match self.reporter {
                    // Istio's metadata exchange is gone with its filters: ours goes before the
                    // router where the agent's logger replaces `istio.stats`.
                    Some(reporter)
                        if wire::string_field(field.value, 1)? == ROUTER_FILTER
                            && self.removed_stats_since(removed_before) =>
                    {
                        let client = reporter == Reporter::Source;
                        let mut filters: Vec<Vec<u8>> = peer::filters(client)
                            .iter()
                            .map(Message::encode_to_vec)
                            .collect();
                        filters.push(field.value.to_vec());
                        Edit::ReplaceMany(filters)
                    }
                    _ => self.rbac_principals(field.value, &HTTP_FILTER)?,
                },
            })
        })?;
        let lost_stats = self.removed_stats_since(removed_before);
        match (edited, self.reporter) {
            (Some(mut hcm), Some(reporter)) if lost_stats => {
                // HttpConnectionManager.access_log (13), repeated: appending adds one.
                wire::put_len(
                    &mut hcm,
                    13,
                    &http_access_log(reporter, &self.stats_plan).encode_to_vec(),
                );
                self.found.metrics_added.push(self.resource.clone());
                Ok(Some(hcm))
            }
            (edited, _) => Ok(edited),
        }
    }

    /// A filter whose typed_config is an RBAC filter config, with its `io.istio.peer_principal`
    /// principals rewritten (see the module docs).
    fn rbac_principals(&mut self, filter: &[u8], shape: &FilterShape) -> Result<Edit, WireError> {
        let edited = wire::rewrite(filter, |field| {
            if field.number != shape.typed_config || !field.is_len() {
                return Ok(Edit::Keep);
            }
            if !RBAC_FILTERS.contains(&type_name(wire::string_field(field.value, 1)?)) {
                return Ok(Edit::Keep);
            }
            let rbac = wire::len_field(field.value, 2)?.unwrap_or_default();
            match rewrite_rbac(rbac)? {
                Some(rbac) => Ok(Edit::Replace(replace_any_value(field.value, &rbac)?)),
                None => Ok(Edit::Keep),
            }
        })?;
        Ok(match edited {
            Some(filter) => {
                if self.found.principals_rewritten.last() != Some(&self.resource) {
                    self.found.principals_rewritten.push(self.resource.clone());
                }
                Edit::Replace(filter)
            }
            None => Edit::Keep,
        })
    }

    /// One network filter of a filter chain: removed when Istio-only; an HCM is entered.
    fn network_filter(&mut self, filter: &[u8]) -> Result<Edit, WireError> {
        let removed_before = self.found.removed.len();
        match self.judge(filter, &NETWORK_FILTER)? {
            Decision::Remove => {
                self.chain_lost_tcp_stats |= self.removed_stats_since(removed_before);
                return Ok(Edit::Drop);
            }
            Decision::Refuse => return Ok(Edit::Keep),
            Decision::Keep => {}
        }
        if let Edit::Replace(rbac) = self.rbac_principals(filter, &NETWORK_FILTER)? {
            return Ok(Edit::Replace(rbac));
        }
        let edited = wire::rewrite(filter, |field| {
            if field.number != NETWORK_FILTER.typed_config || !field.is_len() {
                return Ok(Edit::Keep);
            }
            if type_name(wire::string_field(field.value, 1)?) != HCM {
                return Ok(Edit::Keep);
            }
            let hcm = wire::len_field(field.value, 2)?.unwrap_or_default();
            match self.strip_http_filters(hcm)? {
                Some(hcm) => Ok(Edit::Replace(replace_any_value(field.value, &hcm)?)),
                None => Ok(Edit::Keep),
            }
        })?;
        Ok(edited.map_or(Edit::Keep, Edit::Replace))
    }

    /// Removes the Istio-only network filters of a filter chain (`istio.metadata_exchange`,
    /// `istio.stats` beside a tcp_proxy or an HCM), the Istio-only HTTP filters of its HCMs, and
    /// `istio-peer-exchange` from its DownstreamTlsContext. Where `istio.stats` is removed
    /// beside a tcp_proxy, this is the place a replacement for its metrics belongs.
    fn strip_network_filters(&mut self, chain: &[u8]) -> Result<Option<Vec<u8>>, WireError> {
        self.chain_lost_tcp_stats = false;
        let edited = wire::rewrite(chain, |field| match (field.number, field.is_len()) {
            (3, true) => self.network_filter(field.value),
            (6, true) => Ok(self
                .transport_socket(field.value)?
                .map_or(Edit::Keep, Edit::Replace)),
            _ => Ok(Edit::Keep),
        })?;
        match (edited, self.reporter) {
            (Some(chain), Some(reporter)) if self.chain_lost_tcp_stats => Ok(Some(
                self.log_tcp_proxies(&chain, reporter)?.unwrap_or(chain),
            )),
            (edited, _) => Ok(edited),
        }
    }

    /// The chain's tcp_proxy filters with the agent's access logger (their `istio.stats` was
    /// removed): TcpProxy.access_log (5) appended, access_log_options (17) set (a message
    /// field appended last wins, merged into any earlier one as protobuf does).
    fn log_tcp_proxies(
        &mut self,
        chain: &[u8],
        reporter: Reporter,
    ) -> Result<Option<Vec<u8>>, WireError> {
        wire::rewrite(chain, |field| {
            if field.number != 3 || !field.is_len() {
                return Ok(Edit::Keep);
            }
            let edited = wire::rewrite(field.value, |f| {
                if f.number != NETWORK_FILTER.typed_config || !f.is_len() {
                    return Ok(Edit::Keep);
                }
                if type_name(wire::string_field(f.value, 1)?) != TCP_PROXY {
                    return Ok(Edit::Keep);
                }
                let mut tcp = wire::len_field(f.value, 2)?.unwrap_or_default().to_vec();
                let plan = &self.stats_plan;
                wire::put_len(&mut tcp, 5, &tcp_access_log(reporter, plan).encode_to_vec());
                wire::put_len(&mut tcp, 17, &tcp_access_log_options(plan).encode_to_vec());
                Ok(Edit::Replace(replace_any_value(f.value, &tcp)?))
            })?;
            if edited.is_some() {
                self.found.metrics_added.push(self.resource.clone());
            }
            Ok(edited.map_or(Edit::Keep, Edit::Replace))
        })
    }

    /// A TransportSocket whose TLS context offers `istio-peer-exchange`, without it.
    fn transport_socket(&mut self, socket: &[u8]) -> Result<Option<Vec<u8>>, WireError> {
        let edited = wire::rewrite(socket, |field| {
            if field.number != 3 || !field.is_len() {
                return Ok(Edit::Keep);
            }
            let kind = type_name(wire::string_field(field.value, 1)?);
            if kind != DOWNSTREAM_TLS && kind != UPSTREAM_TLS {
                return Ok(Edit::Keep);
            }
            let tls = wire::len_field(field.value, 2)?.unwrap_or_default();
            // Both contexts hold their CommonTlsContext in field 1, its ALPN list in field 4.
            let tls = wire::rewrite(tls, |f| {
                if f.number != 1 || !f.is_len() {
                    return Ok::<_, WireError>(Edit::Keep);
                }
                let common = wire::rewrite(f.value, |alpn| {
                    Ok::<_, WireError>(
                        if alpn.number == 4 && alpn.value == PEER_EXCHANGE_ALPN.as_bytes() {
                            Edit::Drop
                        } else {
                            Edit::Keep
                        },
                    )
                })?;
                Ok(common.map_or(Edit::Keep, Edit::Replace))
            })?;
            match tls {
                Some(tls) => Ok(Edit::Replace(replace_any_value(field.value, &tls)?)),
                None => Ok(Edit::Keep),
            }
        })?;
        if edited.is_some() {
            self.found.alpn_stripped.push(self.resource.clone());
        }
        Ok(edited)
    }

    fn listener(&mut self, listener: &[u8]) -> Result<Option<Vec<u8>>, WireError> {
        self.reporter = Some(listener_reporter(listener)?);
        // filter_chains (3) and default_filter_chain (25); listener_filters (9) are only
        // judged (an HBONE one removes the listener).
        wire::rewrite(listener, |field| match (field.number, field.is_len()) {
            (3 | 25, true) => Ok(self
                .strip_network_filters(field.value)?
                .map_or(Edit::Keep, Edit::Replace)),
            (9, true) => {
                self.judge(field.value, &LISTENER_FILTER)?;
                Ok(Edit::Keep)
            }
            _ => Ok(Edit::Keep),
        })
    }

    fn cluster(&mut self, cluster: &[u8]) -> Result<Option<Vec<u8>>, WireError> {
        wire::rewrite(cluster, |field| match (field.number, field.is_len()) {
            // filters
            (40, true) => Ok(match self.judge(field.value, &CLUSTER_FILTER)? {
                Decision::Remove => Edit::Drop,
                Decision::Keep | Decision::Refuse => Edit::Keep,
            }),
            // transport_socket
            (24, true) => Ok(self
                .transport_socket(field.value)?
                .map_or(Edit::Keep, Edit::Replace)),
            // transport_socket_matches: the socket is field 3 of each.
            (43, true) => {
                let edited = wire::rewrite(field.value, |m| match (m.number, m.is_len()) {
                    (3, true) => Ok(self
                        .transport_socket(m.value)?
                        .map_or(Edit::Keep, Edit::Replace)),
                    _ => Ok(Edit::Keep),
                })?;
                Ok(edited.map_or(Edit::Keep, Edit::Replace))
            }
            _ => Ok(Edit::Keep),
        })
    }

    /// An ECDS resource: dropped whole when Istio-only (the listener's reference to it is
    /// removed in LDS by the same rule).
    fn extension_config(&mut self, config: &[u8]) -> Result<Edit, WireError> {
        Ok(match self.judge(config, &CLUSTER_FILTER)? {
            Decision::Remove => Edit::Drop,
            Decision::Keep | Decision::Refuse => Edit::Keep,
        })
    }

    /// One resource (an Any) of the response's type.
    fn resource(&mut self, kind: &str, any: &[u8]) -> Result<Edit, WireError> {
        let value = wire::len_field(any, 2)?.unwrap_or_default();
        // Listener, Cluster and TypedExtensionConfig all carry their name in field 1.
        if self.resource.is_empty() {
            self.resource = wire::string_field(value, 1)?.to_string();
        }
        self.drop_resource = false;
        let edited = match kind {
            LISTENER_TYPE => self.listener(value)?,
            CLUSTER_TYPE => self.cluster(value)?,
            EXTENSION_CONFIG_TYPE => match self.extension_config(value)? {
                Edit::Drop => return Ok(Edit::Drop),
                _ => None,
            },
            _ => None,
        };
        if self.drop_resource {
            return Ok(Edit::Drop);
        }
        Ok(match edited {
            Some(value) => Edit::Replace(replace_any_value(any, &value)?),
            None => Edit::Keep,
        })
    }

    /// The resources (field 2) of a response: Anys in state of the world, Resource wrappers
    /// (name 3, Any 2) in Delta.
    fn response(
        &mut self,
        delta: bool,
        kind: &str,
        msg: &[u8],
    ) -> Result<Option<Vec<u8>>, WireError> {
        wire::rewrite(msg, |field| {
            if field.number != 2 || !field.is_len() {
                return Ok(Edit::Keep);
            }
            if !delta {
                self.resource.clear();
                return self.resource(kind, field.value);
            }
            self.resource = wire::string_field(field.value, 3)?.to_string();
            self.drop_resource = false;
            let mut drop = false;
            let edited = wire::rewrite(field.value, |r| {
                if r.number != 2 || !r.is_len() {
                    return Ok(Edit::Keep);
                }
                let edit = self.resource(kind, r.value)?;
                drop = matches!(edit, Edit::Drop);
                Ok(edit)
            })?;
            if self.drop_resource {
                self.dropped.push(self.resource.clone());
            }
            Ok(match (drop, edited) {
                (true, _) => Edit::Drop,
                (false, Some(r)) => Edit::Replace(r),
                (false, None) => Edit::Keep,
            })
        })
    }
}

/// An Any (type_url 1, value 2) with a new value, its type kept.
fn replace_any_value(any: &[u8], value: &[u8]) -> Result<Vec<u8>, WireError> {
    let edited = wire::rewrite(any, |f| {
        Ok(if f.number == 2 {
            Edit::Replace(value.to_vec())
        } else {
            Edit::Keep
        })
    })?;
    Ok(edited.unwrap_or_else(|| {
        let mut out = any.to_vec();
        wire::put_len(&mut out, 2, value);
        out
    }))
}

/// What became of one response.
#[derive(Debug, PartialEq)]
pub enum Adapted {
    /// Nothing to change: forward the bytes as they came.
    Unchanged,
    /// Forward these bytes instead.
    Changed(Bytes, Findings),
    /// Do not forward: NACK upstream with this reason.
    Refused(String, Findings),
}

/// Adapts one (Delta)DiscoveryResponse.
pub fn adapt(delta: bool, msg: &[u8]) -> Result<Adapted, WireError> {
    if !needs_adapting(msg) {
        return Ok(Adapted::Unchanged);
    }
    let kind = wire::string_field(msg, 4)?;
    if ![LISTENER_TYPE, CLUSTER_TYPE, EXTENSION_CONFIG_TYPE].contains(&kind) {
        return Ok(Adapted::Unchanged);
    }
    let mut pass = Pass::default();
    let mut edited = pass.response(delta, kind, msg)?;
    if !pass.dropped.is_empty() {
        // DeltaDiscoveryResponse.removed_resources (6).
        let out = edited.get_or_insert_with(|| msg.to_vec());
        for name in &pass.dropped {
            wire::put_len(out, 6, name.as_bytes());
        }
    }
    let found = pass.found;
    if !found.refused.is_empty() {
        let named: Vec<String> = found
            .refused
            .iter()
            .map(|f| format!("{} in {} (type {})", f.filter, f.resource, f.type_name))
            .collect();
        let why = format!(
            "refused by the agent: security filter of a type upstream Envoy cannot load: {}",
            named.join("; ")
        );
        return Ok(Adapted::Refused(why, found));
    }
    Ok(match edited {
        Some(bytes) => Adapted::Changed(Bytes::from(bytes), found),
        None if found == Findings::default() => Adapted::Unchanged,
        None => Adapted::Changed(Bytes::copy_from_slice(msg), found),
    })
}

/// A request the agent itself sends the control plane on a stream: an ACK of the response
/// `nonce` of `type_url`, or with `error` a NACK of it (`version`: the last one accepted; state
/// of the world only, Delta has no such field).
pub fn answer_upstream(
    delta: bool,
    type_url: &str,
    version: &str,
    nonce: &str,
    error: Option<String>,
) -> Bytes {
    let type_url = type_url.to_string();
    let error_detail = error.map(|message| envoy_types::pb::google::rpc::Status {
        code: tonic::Code::InvalidArgument as i32,
        message,
        ..Default::default()
    });
    Bytes::from(if delta {
        envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
            type_url,
            response_nonce: nonce.to_string(),
            error_detail,
            ..Default::default()
        }
        .encode_to_vec()
    } else {
        envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
            type_url,
            version_info: version.to_string(),
            response_nonce: nonce.to_string(),
            error_detail,
            ..Default::default()
        }
        .encode_to_vec()
    })
}

/// The NACK the agent sends for a refused response (as Envoy would: the nonce, the reason).
pub fn nack(delta: bool, msg: &[u8], why: &str) -> Result<Bytes, WireError> {
    let type_url = wire::string_field(msg, 4)?;
    // nonce: field 5 in both responses.
    let nonce = wire::string_field(msg, 5)?;
    Ok(answer_upstream(
        delta,
        type_url,
        "",
        nonce,
        Some(why.to_string()),
    ))
}

/// How many refusals the debug view keeps.
const REFUSALS_KEPT: usize = 32;
/// How many resources the debug view names per removed or unknown extension.
const RESOURCES_KEPT: usize = 16;

/// What the adapter has done, for `/debug/xds_adapt`.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    /// Removed extensions by type, then filter name: how many, and some resources they were in.
    removed: BTreeMap<String, BTreeMap<String, Seen>>,
    /// Kept extensions of types Envoy cannot load, by type and filter name.
    unknown: BTreeMap<String, BTreeMap<String, Seen>>,
    /// Resources whose `istio-peer-exchange` ALPN was removed.
    alpn_stripped: Seen,
    /// Listeners whose removed `istio.stats` was replaced by the agent's access logger.
    metrics_added: Seen,
    /// Resources whose RBAC principals on `io.istio.peer_principal` became `authenticated`.
    principals_rewritten: Seen,
    /// The last refused responses.
    refused: VecDeque<Refusal>,
    /// Removed filters whose settings beyond istiod's own were lost with them, by type, filter
    /// and settings.
    settings_lost: BTreeMap<String, BTreeMap<String, Seen>>,
}

#[derive(Debug, Default, serde::Serialize)]
struct Seen {
    count: u64,
    resources: BTreeSet<String>,
}

impl Seen {
    fn add(&mut self, resource: &str) {
        self.count += 1;
        if self.resources.len() < RESOURCES_KEPT {
            self.resources.insert(resource.to_string());
        }
    }
}

#[derive(Debug, serde::Serialize)]
struct Refusal {
    type_url: String,
    reason: String,
    filters: Vec<Finding>,
}

/// The adaptation step of the xDS proxy, with its report and metrics.
pub struct Adapter {
    metrics: Arc<crate::metrics::Metrics>,
    report: Mutex<Report>,
}

impl Adapter {
    pub fn new(metrics: Arc<crate::metrics::Metrics>) -> Adapter {
        Adapter {
            metrics,
            report: Mutex::new(Report::default()),
        }
    }

    /// The report as JSON.
    pub fn report_json(&self) -> String {
        match self.report.lock() {
            Ok(report) => serde_json::to_string_pretty(&*report).unwrap_or_default(),
            Err(_) => "{}".to_string(),
        }
    }

    /// Counts and reports what one response held. A refused response reaches Envoy with
    /// nothing removed: only its refusal is recorded.
    fn record(&self, type_url: &str, found: &Findings, refusal: Option<&str>) {
        let Ok(mut report) = self.report.lock() else {
            return;
        };
        if let Some(reason) = refusal {
            self.metrics.xds_adapt_refused.inc();
            if report.refused.len() == REFUSALS_KEPT {
                report.refused.pop_front();
            }
            report.refused.push_back(Refusal {
                type_url: type_url.to_string(),
                reason: reason.to_string(),
                filters: found.refused.clone(),
            });
            return;
        }
        for f in &found.removed {
            self.metrics.xds_adapt_removed(&f.type_name);
            let seen = report.removed.entry(f.type_name.clone()).or_default();
            seen.entry(f.filter.clone()).or_default().add(&f.resource);
        }
        for f in &found.unknown {
            let seen = report.unknown.entry(f.type_name.clone()).or_default();
            seen.entry(f.filter.clone()).or_default().add(&f.resource);
        }
        for r in &found.alpn_stripped {
            report.alpn_stripped.add(r);
        }
        for r in &found.metrics_added {
            report.metrics_added.add(r);
        }
        for r in &found.principals_rewritten {
            report.principals_rewritten.add(r);
        }
        for (f, lost) in &found.settings_lost {
            let key = format!("{} ({})", f.filter, lost.join(", "));
            let seen = report
                .settings_lost
                .entry(f.type_name.clone())
                .or_default()
                .entry(key)
                .or_default();
            // Said once per resource (the first RESOURCES_KEPT of them), not on every push.
            if !seen.resources.contains(&f.resource) && seen.resources.len() < RESOURCES_KEPT {
                tracing::warn!(resource = %f.resource, filter = %f.filter, r#type = %f.type_name,
                    settings = %lost.join(", "),
                    "an Istio-only filter carrying settings istiod does not write (an EnvoyFilter patch on it?) was removed for upstream Envoy; those settings are not applied");
            }
            seen.add(&f.resource);
        }
    }

    /// Adapts one response from the control plane: `Some` is forwarded to Envoy; a refused one
    /// is NACKed on `upstream` and `None` returned. A response that cannot be read is forwarded
    /// as it is, for Envoy to judge.
    pub fn response(
        &self,
        delta: bool,
        msg: Bytes,
        upstream: &tokio::sync::mpsc::Sender<Bytes>,
    ) -> Option<Bytes> {
        match adapt(delta, &msg) {
            Ok(Adapted::Unchanged) => Some(msg),
            Ok(Adapted::Changed(bytes, found)) => {
                let type_url = wire::string_field(&msg, 4).unwrap_or_default();
                for f in &found.unknown {
                    tracing::warn!(resource = %f.resource, filter = %f.filter, r#type = %f.type_name,
                        "extension of a type upstream Envoy lacks; forwarded as it is");
                }
                tracing::debug!(
                    type_url,
                    removed = found.removed.len(),
                    "adapted an xDS response"
                );
                self.record(type_url, &found, None);
                Some(bytes)
            }
            Ok(Adapted::Refused(why, found)) => {
                let type_url = wire::string_field(&msg, 4).unwrap_or_default();
                tracing::error!(type_url, reason = %why, "NACKing an xDS response; Envoy keeps its last config");
                self.record(type_url, &found, Some(&why));
                match nack(delta, &msg, &why) {
                    Ok(request) => {
                        if upstream.try_send(request).is_err() {
                            tracing::warn!("could not send the NACK to the control plane");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "could not build the NACK"),
                }
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read an xDS response to adapt it; forwarded as it is");
                Some(msg)
            }
        }
    }
}

/// The proxy's hook: passes errors through, adapts responses when `adapter` is on.
pub fn apply(
    adapter: Option<&Adapter>,
    delta: bool,
    msg: Result<Bytes, tonic::Status>,
    upstream: &tokio::sync::mpsc::Sender<Bytes>,
) -> Option<Result<Bytes, tonic::Status>> {
    match (adapter, msg) {
        (Some(adapter), Ok(bytes)) => adapter.response(delta, bytes, upstream).map(Ok),
        (_, msg) => Some(msg),
    }
}

#[cfg(test)]
mod tests;
