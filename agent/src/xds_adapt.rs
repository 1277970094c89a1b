//! Adapts a remote istiod's xDS for upstream Envoy and the proxy module (`module/`, the
//! `libistio_module.so` Envoy loads). istiod puts Istio's own extensions into sidecar listeners
//! and clusters; they exist only in Istio's Envoy build (istio/proxy), and an upstream Envoy
//! rejects every resource carrying one ("Didn't find a registered implementation"). This step,
//! between the control plane and Envoy, hands them to the module in LDS and CDS responses (state
//! of the world and Delta): each filter keeps its name and place, and its typed config becomes
//! the module's (a DynamicModuleFilter or DynamicModuleNetworkFilter naming the module's filter,
//! with Istio's config as the module reads it; `map`):
//!
//! - `istio.metadata_exchange`, the HTTP filter (a TypedStruct of
//!   `io.istio.http.peer_metadata.Config`, istio `pilot/pkg/xds/filters` Sidecar*MetadataFilter):
//!   the TypedStruct is passed on as it came (Envoy hands the module its JSON);
//! - `istio.metadata_exchange`, the network filter of inbound chains
//!   (`envoy.tcp.metadataexchange.config.MetadataExchange`, `TCPListenerMx`, a TypedStruct or the
//!   message itself in older istiods): the server side of the TCP exchange;
//! - the HTTP metadata exchange older istiods write as a Wasm filter of the plugin compiled into
//!   istio-proxy (the null VM; istiod 1.18 still does): the module's exchange with istiod's
//!   current config for the listener's side (it speaks the same headers);
//! - `istio.alpn` (`istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig`) and `istio.stats`
//!   (`stats.PluginConfig`, istio `pilot/pkg/networking/core/extension/telemetry`, HTTP and
//!   network filter): their binary config as JSON; `istio.stats` also says the side it reports
//!   for (`source` or `destination`, the listener's traffic direction, which Istio's filter reads
//!   from the listener).
//!
//! A config the module would refuse (one that does not read as Istio's proto, or `reporter`
//! SERVER_GATEWAY, a waypoint's) makes the agent NACK the response with the filter, the resource
//! and the problem named: Envoy is never given a filter that fails to load.
//!
//! What Envoy 1.40 cannot take from a module is moved:
//!
//! - the metadata exchange's cluster filter (`TCPClusterMx`): dynamic modules are no cluster
//!   filters, so it is removed, and each TCP chain (one that ends in tcp_proxy) of an outbound
//!   listener starts with the exchange's client side instead (`istio.metadata_exchange.upstream`,
//!   with istiod's config);
//! - what Istio's filters read of a cluster beyond a module's metadata getters (the list
//!   `istio.services`, the HTTP protocol upstream): every cluster gets it as strings under
//!   `istio_module` (`cluster_metadata`), istiod's own `istio` metadata untouched.
//!
//! ALPN `istio-peer-exchange` stays in the TLS contexts of chains and clusters: the module speaks
//! the exchange it announces.
//!
//! Removed, having nothing in the module:
//!
//! - the null-VM Wasm stats filter of old istiods, and a null-VM metadata exchange anywhere but
//!   in a connection manager;
//! - Istio filters delivered by ECDS (their listener, so their side, unknown there): the ECDS
//!   resource and the listener's reference to it;
//! - `istio_authn` (`io.istio.network.authn.Config`, istiod 1.17–1.19 inbound chains), which
//!   put the peer's SPIFFE URI SAN in the filter state `io.istio.peer_principal` for RBAC
//!   principals to match. Those principals (in the HTTP and network RBAC filters of the same
//!   listeners) become `authenticated.principal_name` with the same matcher: what istiod itself
//!   went back to for sidecars in 1.20 (istio/istio#47395), matched by upstream Envoy against the
//!   verified peer certificate's URI SAN. So no principal of a DENY policy stops matching;
//! - whole listeners that need the HBONE filters of istiod 1.18–1.2x (`istio.set_internal_dst_address`,
//!   `io.istio.http.connect_authority`, `connect_baggage`). Without them HBONE tunnels to and
//!   from this proxy are refused (port 15008 is not served); plain and mTLS traffic is not
//!   affected. istiod 1.31's HBONE listeners (`connect_terminate`, `main_internal`,
//!   `connect_originate`) need none of them: they are upstream Envoy's internal listeners,
//!   CONNECT and set_filter_state, and are kept, their one Istio factory respelled
//!   (`istio.hashable_string` → `envoy.hashable_string`, upstream's hashable string) and their
//!   peer metadata filter given to the module like any other.
//!
//! Settings the module does not apply (custom metric `definitions`, baggage discovery, a TCP
//! exchange's own ALPN, ...) and what goes with a removed filter are logged by name and listed in
//! `/debug/xds_adapt` (`settings_lost`; `lost`).
//!
//! The messages are edited at the wire level (`wire`): everything not changed is kept byte for
//! byte, fields unknown to our generated types included. A listener or extension-config response
//! with nothing to change is found by a scan of its bytes and forwarded as it came; cluster
//! responses are always walked (their metadata is read).
//!
//! Security filters (RBAC, jwt_authn, ext_authz) are never dropped: one whose type upstream Envoy
//! cannot load makes the agent NACK the response to the control plane (Envoy keeps its last good
//! config). Other unknown types are kept and reported by name (Envoy then rejects the resource).

mod cluster_metadata;
mod lost;
mod map;
mod wire;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use map::Mapped;
use mesh_common::module::{TcpExchange, filter::METADATA_EXCHANGE_UPSTREAM};
use mesh_common::telemetry::module_filters::{NETWORK_TYPE, json_config, network_filter};
use prost::Message;
use wire::Edit;
pub use wire::WireError;

pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const EXTENSION_CONFIG_TYPE: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";

/// Istio's extension types, as Envoy looks them up (a TypedStruct's inner type).
pub const PEER_METADATA: &str = "io.istio.http.peer_metadata.Config";
pub const TCP_METADATA_EXCHANGE: &str = "envoy.tcp.metadataexchange.config.MetadataExchange";
pub const ALPN_OVERRIDE: &str = "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig";
pub const ISTIO_STATS: &str = "stats.PluginConfig";
/// Older istiods wrote metadata exchange (1.18 still does, for HTTP) and stats as Wasm filters of
/// plugins compiled into istio-proxy (the null VM); no upstream Envoy has them. Reported as
/// `null-vm:<plugin>`.
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
/// The filter-state object factory istiod 1.29.2+ names in HBONE's `connect_authority`
/// set_filter_state (istio/proxy's hashable string), and upstream Envoy's of the same kind
/// (`StringAccessor` plus `Hashable`, so the value still keys upstream connection pools). Same
/// length: the rewrite keeps every length prefix.
const ISTIO_HASHABLE_STRING: &[u8] = b"istio.hashable_string";
const ENVOY_HASHABLE_STRING: &[u8] = b"envoy.hashable_string";
const SET_FILTER_STATE: [&str; 2] = [
    "envoy.extensions.filters.http.set_filter_state.v3.Config",
    "envoy.extensions.filters.network.set_filter_state.v3.Config",
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
/// The name istiod gives the tcp_proxy filter.
const TCP_PROXY_FILTER: &str = "envoy.filters.network.tcp_proxy";
const TYPED_STRUCTS: [&str; 2] = ["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"];
const TYPE_PREFIX: &[u8] = b"type.googleapis.com/";

/// `udpa.type.v1.TypedStruct` / `xds.type.v3.TypedStruct` (the same fields), how istiod wraps
/// Istio's extensions' configs. The adapter reads them on the wire; the tests and the bench
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

/// Whether a listener or extension-config response `msg` may carry something to adapt: the null
/// VM, RBAC on `io.istio.peer_principal`, an Any type URL outside Envoy's own API, or a
/// tcp_proxy (an outbound TCP chain takes the exchange's client side). A response whose every
/// `type.googleapis.com/` names an Envoy or well-known type and that has none of those is
/// forwarded untouched without being decoded. (Cluster responses are always read.)
pub fn needs_adapting(msg: &[u8]) -> bool {
    if memchr::memmem::find(msg, NULL_VM.as_bytes()).is_some()
        || memchr::memmem::find(msg, PEER_PRINCIPAL_KEY).is_some()
        || memchr::memmem::find(msg, ISTIO_HASHABLE_STRING).is_some()
        || memchr::memmem::find(msg, TCP_PROXY.as_bytes()).is_some()
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
    /// The type Envoy would look up (for a mapped filter, Istio's type it had).
    #[serde(rename = "type")]
    pub type_name: String,
}

/// What one response held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Istio's filters handed to the proxy module (same name and place, the module's config).
    pub mapped: Vec<Finding>,
    /// Extensions removed: the exchange's cluster filters, and what the module has nothing for
    /// (null-VM Wasm stats, ECDS-delivered Istio filters, `istio_authn`, HBONE listeners).
    pub removed: Vec<Finding>,
    /// Security filters of a type Envoy cannot load: the response is refused.
    pub refused: Vec<Finding>,
    /// Istio filters whose config the module would refuse, and why: the response is refused.
    pub invalid: Vec<(Finding, String)>,
    /// Other types Envoy cannot load, kept (Envoy rejects the resource).
    pub unknown: Vec<Finding>,
    /// Listeners whose TCP chains got the exchange's client side, one entry per chain.
    pub exchange_added: Vec<String>,
    /// Clusters given the module's metadata (`istio_module`).
    pub cluster_metadata_added: Vec<String>,
    /// Resources whose RBAC principals on `io.istio.peer_principal` became `authenticated`.
    pub principals_rewritten: Vec<String>,
    /// Mapped or removed filters with settings the module does not apply: the filter, and those
    /// settings (`lost`).
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
    /// The listener being walked: the side its metrics report (`source`, `destination`), and
    /// whether it is outbound.
    side: &'static str,
    outbound: bool,
    /// The listener being walked has `istio_authn` (istiod 1.17–1.19): its RBAC principals on
    /// `io.istio.peer_principal` are rewritten. Elsewhere (istiod 1.31's HBONE `main_internal`,
    /// where `connect_terminate`'s set_filter_state shares that filter state with the internal
    /// connection) they match as they are.
    peer_authn: bool,
}

/// A listener's side and whether it is outbound: its `traffic_direction` (16: INBOUND 1,
/// OUTBOUND 2); without one, Istio's inbound listener name reports as `destination`, any other
/// as `source` (as Istio's filters do).
fn listener_direction(listener: &[u8]) -> Result<(&'static str, bool), WireError> {
    Ok(match wire::varint_field(listener, 16)? {
        Some(1) => ("destination", false),
        Some(2) => ("source", true),
        _ if wire::string_field(listener, 1)? == "virtualInbound" => ("destination", false),
        _ => ("source", false),
    })
}

/// Where a filter sits, which decides what the module has for it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// An HTTP filter of a connection manager.
    Http,
    /// A network filter of a listener's filter chain.
    Network,
    /// A cluster's upstream network filter (`Cluster.filters`).
    Cluster,
    /// A listener filter.
    Listener,
    /// Delivered by extension config discovery: its listener, and so its direction, unknown.
    Ecds,
}

enum Decision {
    Keep,
    Remove,
    Refuse,
    /// The filter as it is to be (its typed config the module's).
    Replace(Vec<u8>),
}

/// Which of a filter message's fields hold what: listener, HTTP and cluster filters differ.
struct FilterShape {
    place: Place,
    typed_config: u32,
    config_discovery: u32,
    is_optional: Option<u32>,
}

const NETWORK_FILTER: FilterShape = FilterShape {
    place: Place::Network,
    typed_config: 4,
    config_discovery: 5,
    is_optional: None,
};
const HTTP_FILTER: FilterShape = FilterShape {
    place: Place::Http,
    typed_config: 4,
    config_discovery: 5,
    is_optional: Some(6),
};
const CLUSTER_FILTER: FilterShape = FilterShape {
    place: Place::Cluster,
    typed_config: 2,
    config_discovery: 3,
    is_optional: None,
};
const LISTENER_FILTER: FilterShape = FilterShape {
    place: Place::Listener,
    typed_config: 3,
    config_discovery: 5,
    is_optional: None,
};
/// A TypedExtensionConfig (name 1, typed_config 2), an ECDS resource.
const EXTENSION_CONFIG: FilterShape = FilterShape {
    place: Place::Ecds,
    typed_config: 2,
    config_discovery: 3,
    is_optional: None,
};

/// The filter (a listener's network Filter) that runs the exchange's client side.
fn upstream_exchange() -> Vec<u8> {
    network_filter(
        METADATA_EXCHANGE_UPSTREAM,
        json_config(&TcpExchange::istio()),
    )
    .encode_to_vec()
}

/// Whether a filter chain's filters (3) end in tcp_proxy (by name or type) and none is the
/// exchange's client side already (by name, or a module config naming it: DynamicModuleNetworkFilter
/// `filter_name` 2).
fn wants_upstream_exchange(chain: &[u8]) -> Result<bool, WireError> {
    let filters = wire::repeated(chain, 3)?;
    let Some(last) = filters.last() else {
        return Ok(false);
    };
    let last_type = wire::len_field(last, NETWORK_FILTER.typed_config)?.unwrap_or_default();
    if wire::string_field(last, 1)? != TCP_PROXY_FILTER
        && type_name(wire::string_field(last_type, 1)?) != TCP_PROXY
    {
        return Ok(false);
    }
    for f in &filters {
        if wire::string_field(f, 1)? == METADATA_EXCHANGE_UPSTREAM {
            return Ok(false);
        }
        let any = wire::len_field(f, NETWORK_FILTER.typed_config)?.unwrap_or_default();
        if wire::string_field(any, 1)? == NETWORK_TYPE {
            let module = wire::len_field(any, 2)?.unwrap_or_default();
            if wire::string_field(module, 2)? == METADATA_EXCHANGE_UPSTREAM {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

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

/// `filter` with its typed_config replaced by `config`.
fn with_typed_config(
    filter: &[u8],
    shape: &FilterShape,
    config: Vec<u8>,
) -> Result<Vec<u8>, WireError> {
    let edited = wire::rewrite(filter, |f| {
        Ok(if f.number == shape.typed_config && f.is_len() {
            Edit::Replace(config.clone())
        } else {
            Edit::Keep
        })
    })?;
    Ok(edited.unwrap_or_else(|| filter.to_vec()))
}

/// A set_filter_state filter's Any (HTTP `on_request_headers` 1 or network `on_new_connection`
/// 1, each a FilterStateValue with `factory_key` 6) with istiod's `istio.hashable_string`
/// factory as upstream Envoy's `envoy.hashable_string`; `None` when it names none.
fn upstream_factories(any: &[u8]) -> Edited {
    let value = |v: &[u8]| {
        wire::rewrite(v, |f| {
            Ok(
                if f.number == 6 && f.is_len() && f.value == ISTIO_HASHABLE_STRING {
                    Edit::Replace(ENVOY_HASHABLE_STRING.to_vec())
                } else {
                    Edit::Keep
                },
            )
        })
    };
    let config = |c: &[u8]| rewrite_field(c, 1, &value);
    rewrite_field(any, 2, &config)
}

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
    fn finding(&self, filter: &str, type_name: &str) -> Finding {
        Finding {
            resource: self.resource.clone(),
            filter: filter.to_string(),
            type_name: type_name.to_string(),
        }
    }

    /// Judges one filter by the types it names (its typed_config, or the type_urls of its
    /// config_discovery): all loadable, kept; an Istio filter the module has at this place,
    /// given to the module (or refused when the module would refuse its config); other Istio
    /// extensions, removed; a security filter with a type Envoy lacks, refused; anything else
    /// unknown, kept and reported.
    fn judge(&mut self, filter: &[u8], shape: &FilterShape) -> Result<Decision, WireError> {
        let name = wire::string_field(filter, 1)?;
        let mut types = Vec::new();
        let mut optional = false;
        let mut typed_config = None;
        let mut discovered = false;
        for field in wire::fields(filter) {
            let field = field?;
            if field.number == shape.typed_config && field.is_len() {
                typed_config = Some(field.value);
                types.push(extension_type(field.value)?);
            } else if field.number == shape.config_discovery && field.is_len() {
                discovered = true;
                for url in wire::repeated(field.value, 4)? {
                    types.push(type_name(std::str::from_utf8(url).unwrap_or_default()).to_string());
                }
            } else if Some(field.number) == shape.is_optional {
                optional = field.varint().unwrap_or(0) != 0;
            }
        }
        if types.iter().all(|t| loadable(t)) {
            if let (Some(any), [t]) = (typed_config, types.as_slice())
                && SET_FILTER_STATE.contains(&t.as_str())
                && let Some(config) = upstream_factories(any)?
            {
                self.found
                    .mapped
                    .push(self.finding(name, "istio.hashable_string"));
                return Ok(Decision::Replace(with_typed_config(filter, shape, config)?));
            }
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
        if !types.iter().all(|t| istio_only(t)) {
            if !optional {
                for t in types.iter().filter(|t| !loadable(t)) {
                    self.found.unknown.push(self.finding(name, t));
                }
            }
            return Ok(Decision::Keep);
        }
        let place = if discovered { Place::Ecds } else { shape.place };
        if let (Some(any), [t]) = (typed_config, types.as_slice()) {
            match map::filter(place, t, any, self.side) {
                Some(Mapped::Config(config, lost)) => {
                    let finding = self.finding(name, t);
                    if !lost.is_empty() {
                        self.found.settings_lost.push((finding.clone(), lost));
                    }
                    self.found.mapped.push(finding);
                    let config = config.encode_to_vec();
                    return Ok(Decision::Replace(with_typed_config(filter, shape, config)?));
                }
                Some(Mapped::Invalid(why)) => {
                    self.found.invalid.push((self.finding(name, t), why));
                    return Ok(Decision::Refuse);
                }
                None => {}
            }
        }
        for t in &types {
            let finding = self.finding(name, t);
            let lost = map::lost_with_removal(t, place, typed_config);
            if !lost.is_empty() {
                self.found.settings_lost.push((finding.clone(), lost));
            }
            self.found.removed.push(finding);
        }
        Ok(Decision::Remove)
    }

    /// The HTTP filters of an HttpConnectionManager (5): Istio's given to the module or removed,
    /// RBAC principals rewritten.
    fn http_filters(&mut self, hcm: &[u8]) -> Edited {
        wire::rewrite(hcm, |field| {
            if field.number != 5 || !field.is_len() {
                return Ok(Edit::Keep);
            }
            Ok(match self.judge(field.value, &HTTP_FILTER)? {
                Decision::Remove => Edit::Drop,
                Decision::Refuse => Edit::Keep,
                Decision::Replace(f) => Edit::Replace(f),
                Decision::Keep => self.rbac_principals(field.value, &HTTP_FILTER)?,
            })
        })
    }

    /// A filter whose typed_config is an RBAC filter config, with its `io.istio.peer_principal`
    /// principals rewritten (see the module docs).
    fn rbac_principals(&mut self, filter: &[u8], shape: &FilterShape) -> Result<Edit, WireError> {
        if !self.peer_authn {
            return Ok(Edit::Keep);
        }
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

    /// One network filter of a filter chain: Istio's given to the module or removed; an HCM is
    /// entered.
    fn network_filter(&mut self, filter: &[u8]) -> Result<Edit, WireError> {
        match self.judge(filter, &NETWORK_FILTER)? {
            Decision::Remove => return Ok(Edit::Drop),
            Decision::Refuse => return Ok(Edit::Keep),
            Decision::Replace(f) => return Ok(Edit::Replace(f)),
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
            match self.http_filters(hcm)? {
                Some(hcm) => Ok(Edit::Replace(replace_any_value(field.value, &hcm)?)),
                None => Ok(Edit::Keep),
            }
        })?;
        Ok(edited.map_or(Edit::Keep, Edit::Replace))
    }

    /// A filter chain's network filters (3), and on an outbound listener the exchange's client
    /// side put just before tcp_proxy when the chain ends in it (the cluster filter Istio runs
    /// it as is removed): after the metrics, so they count the app's bytes, not the frames.
    fn filter_chain(&mut self, chain: &[u8]) -> Edited {
        let add_exchange = self.outbound && wants_upstream_exchange(chain)?;
        let mut filters_left = if add_exchange {
            wire::fields(chain)
                .filter(|f| f.as_ref().is_ok_and(|f| f.number == 3 && f.is_len()))
                .count()
        } else {
            0
        };
        let edited = wire::rewrite(chain, |field| {
            if field.number != 3 || !field.is_len() {
                return Ok(Edit::Keep);
            }
            let edit = self.network_filter(field.value)?;
            filters_left = filters_left.saturating_sub(1);
            if !add_exchange || filters_left > 0 {
                return Ok(edit);
            }
            // The last filter: tcp_proxy.
            let mut filters = vec![upstream_exchange()];
            match edit {
                Edit::Replace(f) => filters.push(f),
                Edit::Drop => {}
                _ => filters.push(field.value.to_vec()),
            }
            Ok(Edit::ReplaceMany(filters))
        })?;
        if add_exchange {
            self.found.exchange_added.push(self.resource.clone());
        }
        Ok(edited)
    }

    fn listener(&mut self, listener: &[u8]) -> Edited {
        (self.side, self.outbound) = listener_direction(listener)?;
        self.peer_authn = memchr::memmem::find(listener, PEER_AUTHN.as_bytes()).is_some();
        // filter_chains (3) and default_filter_chain (25); listener_filters (9) are judged (an
        // HBONE one removes the listener).
        wire::rewrite(listener, |field| match (field.number, field.is_len()) {
            (3 | 25, true) => Ok(self
                .filter_chain(field.value)?
                .map_or(Edit::Keep, Edit::Replace)),
            (9, true) => Ok(match self.judge(field.value, &LISTENER_FILTER)? {
                Decision::Remove => Edit::Drop,
                Decision::Replace(f) => Edit::Replace(f),
                Decision::Keep | Decision::Refuse => Edit::Keep,
            }),
            _ => Ok(Edit::Keep),
        })
    }

    /// A cluster: the exchange's cluster filter (filters 40) removed, the module's metadata added
    /// to its metadata (25), or as its metadata when it has none.
    fn cluster(&mut self, cluster: &[u8]) -> Edited {
        let entry = cluster_metadata::entry(cluster)?;
        let mut placed = false;
        let edited = wire::rewrite(cluster, |field| match (field.number, field.is_len()) {
            (40, true) => Ok(match self.judge(field.value, &CLUSTER_FILTER)? {
                Decision::Remove => Edit::Drop,
                Decision::Replace(f) => Edit::Replace(f),
                Decision::Keep | Decision::Refuse => Edit::Keep,
            }),
            // Metadata.filter_metadata (1), a map: one more entry.
            (25, true) if !placed => match &entry {
                Some(entry) => {
                    placed = true;
                    let mut metadata = field.value.to_vec();
                    wire::put_len(&mut metadata, 1, entry);
                    Ok(Edit::Replace(metadata))
                }
                None => Ok(Edit::Keep),
            },
            _ => Ok(Edit::Keep),
        })?;
        let Some(entry) = entry else {
            return Ok(edited);
        };
        self.found
            .cluster_metadata_added
            .push(self.resource.clone());
        if placed {
            return Ok(edited);
        }
        let mut out = edited.unwrap_or_else(|| cluster.to_vec());
        let mut metadata = Vec::new();
        wire::put_len(&mut metadata, 1, &entry);
        wire::put_len(&mut out, 25, &metadata);
        Ok(Some(out))
    }

    /// An ECDS resource: dropped whole when Istio's (the listener's reference to it is removed
    /// in LDS by the same rule).
    fn extension_config(&mut self, config: &[u8]) -> Result<Edit, WireError> {
        Ok(match self.judge(config, &EXTENSION_CONFIG)? {
            Decision::Remove => Edit::Drop,
            Decision::Replace(c) => Edit::Replace(c),
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
                Edit::Replace(v) => Some(v),
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
    let kind = wire::string_field(msg, 4)?;
    if ![LISTENER_TYPE, CLUSTER_TYPE, EXTENSION_CONFIG_TYPE].contains(&kind) {
        return Ok(Adapted::Unchanged);
    }
    if kind != CLUSTER_TYPE && !needs_adapting(msg) {
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
    if let Some(why) = refusal(&found) {
        return Ok(Adapted::Refused(why, found));
    }
    Ok(match edited {
        Some(bytes) => Adapted::Changed(Bytes::from(bytes), found),
        None if found == Findings::default() => Adapted::Unchanged,
        None => Adapted::Changed(Bytes::copy_from_slice(msg), found),
    })
}

/// Why a response is refused, if it is: the security filters Envoy cannot load, the Istio
/// filters whose config the module would refuse, each named with its resource.
fn refusal(found: &Findings) -> Option<String> {
    let mut reasons = Vec::new();
    if !found.refused.is_empty() {
        let named: Vec<String> = found
            .refused
            .iter()
            .map(|f| format!("{} in {} (type {})", f.filter, f.resource, f.type_name))
            .collect();
        reasons.push(format!(
            "security filter of a type upstream Envoy cannot load: {}",
            named.join("; ")
        ));
    }
    for (f, why) in &found.invalid {
        reasons.push(format!(
            "{} in {} (type {}): {why}",
            f.filter, f.resource, f.type_name
        ));
    }
    (!reasons.is_empty()).then(|| format!("refused by the agent: {}", reasons.join("; ")))
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
/// How many resources the debug view names per mapped, removed or unknown extension.
const RESOURCES_KEPT: usize = 16;

/// What the adapter has done, for `/debug/xds_adapt`.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    /// Istio's filters handed to the proxy module, by Istio's type, then filter name: how many,
    /// and some resources they were in.
    mapped: BTreeMap<String, BTreeMap<String, Seen>>,
    /// Removed extensions, by type and filter name.
    removed: BTreeMap<String, BTreeMap<String, Seen>>,
    /// Kept extensions of types Envoy cannot load, by type and filter name.
    unknown: BTreeMap<String, BTreeMap<String, Seen>>,
    /// Listeners whose outbound TCP chains got the exchange's client side.
    exchange_added: Seen,
    /// Clusters given the module's metadata.
    cluster_metadata_added: Seen,
    /// Resources whose RBAC principals on `io.istio.peer_principal` became `authenticated`.
    principals_rewritten: Seen,
    /// The last refused responses.
    refused: VecDeque<Refusal>,
    /// Filters with settings the module does not apply, by type, filter and settings.
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

    /// Counts and reports what one response held. A refused response never reaches Envoy: only
    /// its refusal is recorded.
    fn record(&self, type_url: &str, found: &Findings, refusal: Option<&str>) {
        let Ok(mut report) = self.report.lock() else {
            return;
        };
        if let Some(reason) = refusal {
            self.metrics.xds_adapt_refused.inc();
            if report.refused.len() == REFUSALS_KEPT {
                report.refused.pop_front();
            }
            let mut filters = found.refused.clone();
            filters.extend(found.invalid.iter().map(|(f, _)| f.clone()));
            report.refused.push_back(Refusal {
                type_url: type_url.to_string(),
                reason: reason.to_string(),
                filters,
            });
            return;
        }
        for f in &found.mapped {
            let seen = report.mapped.entry(f.type_name.clone()).or_default();
            seen.entry(f.filter.clone()).or_default().add(&f.resource);
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
        for r in &found.exchange_added {
            report.exchange_added.add(r);
        }
        for r in &found.cluster_metadata_added {
            report.cluster_metadata_added.add(r);
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
                    "an Istio filter carries settings the proxy module does not apply (an EnvoyFilter patch on it?); those settings have no effect");
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
                    mapped = found.mapped.len(),
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
