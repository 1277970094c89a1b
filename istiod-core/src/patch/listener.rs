//! LISTENER, LISTENER_FILTER, FILTER_CHAIN, NETWORK_FILTER and HTTP_FILTER patches (istiod's
//! `listener_patch.go`), and the route patches of an HTTP connection manager's inline route
//! configuration (a sidecar's inbound routes).

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::{
    CompiledPatch, Named, adds_to, merge_into, merge_transport_socket, merge_typed_config,
    patch_named,
};
use crate::config_store::envoy_filter::{ApplyTo, HCM, Operation, PatchContext};
use crate::resource::{VIRTUAL_INBOUND, VIRTUAL_OUTBOUND};

const LISTENER: &str = "envoy.config.listener.v3.Listener";
const FILTER_CHAIN: &str = "envoy.config.listener.v3.FilterChain";

pub(super) fn apply(router: bool, patches: &[&CompiledPatch], resources: &mut Vec<Named>) {
    let mut contexts = Vec::new();
    let mut out = Vec::with_capacity(resources.len());
    for named in resources.iter() {
        let patched = patch_named::<Listener>(named, |l| {
            let ctx = context(router, l);
            if !contexts.contains(&ctx) {
                contexts.push(ctx);
            }
            patch_listener(l, ctx, patches)
        });
        out.extend(patched);
    }
    if contexts.is_empty() {
        contexts.push(if router {
            PatchContext::Gateway
        } else {
            PatchContext::SidecarOutbound
        });
    }
    // LISTENER ADD: once per list (inbound, outbound, gateway) it names.
    for p in patches
        .iter()
        .filter(|p| p.apply_to == ApplyTo::Listener && p.operation == Operation::Add)
    {
        if !contexts.iter().any(|c| adds_to(p.context(), *c)) {
            continue;
        }
        if let Some(l) = p.value_as::<Listener>() {
            out.push(Named::new(l.name.clone(), envoy_types::util::pack_any(l)));
        }
    }
    *resources = out;
}

/// A router's listeners are GATEWAY; a sidecar's `virtualInbound` and inbound listeners
/// SIDECAR_INBOUND, the rest SIDECAR_OUTBOUND.
fn context(router: bool, l: &Listener) -> PatchContext {
    if router {
        return PatchContext::Gateway;
    }
    super::sidecar_context(
        l.name == VIRTUAL_INBOUND || l.traffic_direction == TrafficDirection::Inbound as i32,
    )
}

fn is_virtual(l: &Listener) -> bool {
    l.name == VIRTUAL_INBOUND || l.name == VIRTUAL_OUTBOUND
}

fn port(l: &Listener) -> Option<u32> {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    match l.address.as_ref()?.address.as_ref()? {
        address::Address::SocketAddress(s) => match s.port_specifier.as_ref()? {
            socket_address::PortSpecifier::PortValue(p) => Some(*p),
            _ => None,
        },
        _ => None,
    }
}

/// `match.listener`: name exact, port (a virtual listener's port is its chains' for every
/// applyTo but LISTENER).
fn listener_matches(l: &Listener, p: &CompiledPatch) -> bool {
    let Some(m) = &p.matches.listener else {
        return true;
    };
    if m.name.as_deref().is_some_and(|n| n != l.name) {
        return false;
    }
    if p.apply_to != ApplyTo::Listener && is_virtual(l) {
        return true;
    }
    m.port_number == 0 || port(l) == Some(m.port_number)
}

/// `match.listener.filterChain` (and a virtual listener's port as the chain's destination).
fn chain_matches(l: &Listener, fc: &FilterChain, p: &CompiledPatch) -> bool {
    let Some(m) = &p.matches.listener else {
        return true;
    };
    let fcm = fc.filter_chain_match.as_ref();
    if is_virtual(l)
        && m.port_number > 0
        && fcm
            .and_then(|f| f.destination_port.as_ref())
            .map(|d| d.value)
            != Some(m.port_number)
    {
        return false;
    }
    let Some(c) = &m.filter_chain else {
        return true;
    };
    if c.name.as_deref().is_some_and(|n| n != fc.name) {
        return false;
    }
    if let Some(sni) = &c.sni
        && !fcm.is_some_and(|f| f.server_names.contains(sni))
    {
        return false;
    }
    if let Some(t) = &c.transport_protocol
        && fcm.map(|f| f.transport_protocol.as_str()) != Some(t.as_str())
    {
        return false;
    }
    if let Some(protocols) = &c.application_protocols
        && !protocols
            .split(',')
            .all(|a| fcm.is_some_and(|f| f.application_protocols.iter().any(|x| x == a)))
    {
        return false;
    }
    if c.destination_port > 0
        && fcm
            .and_then(|f| f.destination_port.as_ref())
            .map(|d| d.value)
            != Some(c.destination_port)
    {
        return false;
    }
    true
}

/// The listener patched; `false`: removed.
fn patch_listener(l: &mut Listener, ctx: PatchContext, patches: &[&CompiledPatch]) -> bool {
    for p in patches
        .iter()
        .filter(|p| p.apply_to == ApplyTo::Listener && p.in_context(ctx))
    {
        if !listener_matches(l, p) {
            continue;
        }
        match p.operation {
            Operation::Remove => return false,
            Operation::Merge | Operation::MergeAndReplaceList => merge_into(l, LISTENER, p),
            _ => {}
        }
    }
    let anchor = |p: &CompiledPatch| {
        p.matches
            .listener
            .as_ref()
            .and_then(|m| m.listener_filter.clone())
    };
    let listener_filters: Vec<&CompiledPatch> = patches
        .iter()
        .copied()
        .filter(|p| {
            p.apply_to == ApplyTo::ListenerFilter && p.in_context(ctx) && listener_matches(l, p)
        })
        .collect();
    filter_list(&mut l.listener_filters, &listener_filters, anchor);

    let mut chains = std::mem::take(&mut l.filter_chains);
    chains.retain_mut(|fc| patch_chain(l, fc, ctx, patches));
    l.filter_chains = chains;
    if let Some(mut fc) = l.default_filter_chain.take()
        && patch_chain(l, &mut fc, ctx, patches)
    {
        l.default_filter_chain = Some(fc);
    }
    for p in patches {
        if p.apply_to == ApplyTo::FilterChain
            && p.operation == Operation::Add
            && p.in_context(ctx)
            && listener_matches(l, p)
            && let Some(fc) = p.value_as::<FilterChain>()
        {
            l.filter_chains.push(fc);
        }
    }
    true
}

/// One chain patched; `false`: removed.
fn patch_chain(
    l: &Listener,
    fc: &mut FilterChain,
    ctx: PatchContext,
    patches: &[&CompiledPatch],
) -> bool {
    if fc.filters.is_empty() {
        return true;
    }
    let mine = |p: &CompiledPatch, fc: &FilterChain, applies: ApplyTo| {
        p.apply_to == applies
            && p.in_context(ctx)
            && listener_matches(l, p)
            && chain_matches(l, fc, p)
    };
    for p in patches {
        if !mine(p, fc, ApplyTo::FilterChain) {
            continue;
        }
        match p.operation {
            Operation::Remove => return false,
            Operation::Merge | Operation::MergeAndReplaceList => merge_chain(fc, p),
            _ => {}
        }
    }
    let network: Vec<&CompiledPatch> = patches
        .iter()
        .copied()
        .filter(|p| mine(p, fc, ApplyTo::NetworkFilter))
        .collect();
    filter_list(&mut fc.filters, &network, |p| {
        filter_anchor(p).map(str::to_string)
    });
    let http: Vec<&CompiledPatch> = patches
        .iter()
        .copied()
        .filter(|p| mine(p, fc, ApplyTo::HttpFilter))
        .collect();
    let routes: Vec<&CompiledPatch> = patches
        .iter()
        .copied()
        .filter(|p| {
            matches!(
                p.apply_to,
                ApplyTo::RouteConfiguration | ApplyTo::VirtualHost | ApplyTo::HttpRoute
            ) && p.in_context(ctx)
        })
        .collect();
    if http.is_empty() && routes.is_empty() {
        return true;
    }
    for f in fc.filters.iter_mut().filter(|f| f.name == HCM) {
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            continue;
        };
        let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
            continue;
        };
        let for_this: Vec<&CompiledPatch> = http
            .iter()
            .copied()
            .filter(|p| filter_anchor(p).is_none_or(|n| n == f.name))
            .collect();
        filter_list(&mut hcm.http_filters, &for_this, |p| {
            sub_filter_anchor(p).map(str::to_string)
        });
        // A sidecar's inbound routes are inline (istiod patches them as it builds them).
        if let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) =
            &mut hcm.route_specifier
        {
            super::route::patch_config(rc, ctx, false, &routes);
        }
        f.config_type = Some(filter::ConfigType::TypedConfig(
            envoy_types::util::pack_any(hcm),
        ));
    }
    true
}

/// A chain MERGE: a transport socket of the same name has its typed config merged (and nothing
/// else of the patch applied, as in istiod); otherwise the whole value is merged.
fn merge_chain(fc: &mut FilterChain, p: &CompiledPatch) {
    let patch_ts = p.value_as::<FilterChain>().and_then(|v| v.transport_socket);
    if let (Some(src), Some(dst)) = (&patch_ts, &mut fc.transport_socket)
        && src.name == dst.name
    {
        merge_transport_socket(dst, src, p);
        return;
    }
    merge_into(fc, FILTER_CHAIN, p);
}

/// `match.listener.filterChain.filter`.
fn filter_match(p: &CompiledPatch) -> Option<&crate::config_store::envoy_filter::FilterMatch> {
    p.matches
        .listener
        .as_ref()?
        .filter_chain
        .as_ref()?
        .filter
        .as_ref()
}

fn filter_anchor(p: &CompiledPatch) -> Option<&str> {
    filter_match(p).map(|f| f.name.as_str())
}

fn sub_filter_anchor(p: &CompiledPatch) -> Option<&str> {
    filter_match(p)?
        .sub_filter
        .as_ref()
        .map(|s| s.name.as_str())
}

/// A named filter with a typed config: a listener filter, a network filter, an HTTP filter.
trait TypedFilter: Message + Default + Clone {
    fn name(&self) -> &str;
    fn set_name(&mut self, name: String);
    fn typed_config(&self) -> Option<&Any>;
    fn set_typed_config(&mut self, any: Any);
}

macro_rules! typed_filter {
    ($t:ty, $config:path) => {
        impl TypedFilter for $t {
            fn name(&self) -> &str {
                &self.name
            }
            fn set_name(&mut self, name: String) {
                self.name = name;
            }
            fn typed_config(&self) -> Option<&Any> {
                use $config as C;
                match &self.config_type {
                    Some(C::TypedConfig(a)) => Some(a),
                    _ => None,
                }
            }
            fn set_typed_config(&mut self, any: Any) {
                use $config as C;
                self.config_type = Some(C::TypedConfig(any));
            }
        }
    };
}

typed_filter!(Filter, filter::ConfigType);
typed_filter!(HttpFilter, http_filter::ConfigType);
typed_filter!(ListenerFilter, listener_filter::ConfigType);

/// istiod's filter-list operations, then MERGE of each filter its anchor names (no anchor:
/// every filter). `anchor` reads a patch's anchor name.
fn filter_list<F: TypedFilter>(
    list: &mut Vec<F>,
    patches: &[&CompiledPatch],
    anchor: impl Fn(&CompiledPatch) -> Option<String>,
) {
    for p in patches {
        let name = anchor(p);
        let first = || {
            name.as_deref()
                .and_then(|n| list.iter().position(|f| f.name() == n))
        };
        match p.operation {
            Operation::Add => list.extend(p.value_as::<F>()),
            Operation::InsertFirst => {
                if let Some(v) = p.value_as::<F>() {
                    list.insert(0, v);
                }
            }
            Operation::InsertAfter => match (name.is_some(), first()) {
                (false, _) => list.extend(p.value_as::<F>()),
                (true, Some(i)) => {
                    if let Some(v) = p.value_as::<F>() {
                        list.insert(i + 1, v);
                    }
                }
                (true, None) => p.skipped("INSERT_AFTER: no filter of that name"),
            },
            Operation::InsertBefore => match (name.is_some(), first()) {
                (false, _) => {
                    if let Some(v) = p.value_as::<F>() {
                        list.insert(0, v);
                    }
                }
                (true, Some(i)) => {
                    if let Some(v) = p.value_as::<F>() {
                        list.insert(i, v);
                    }
                }
                (true, None) => p.skipped("INSERT_BEFORE: no filter of that name"),
            },
            Operation::Replace => match first() {
                Some(i) => {
                    if let Some(v) = p.value_as::<F>() {
                        list[i] = v;
                    }
                }
                None => p.skipped("REPLACE: no filter of that name"),
            },
            Operation::Remove => {
                if let Some(n) = &name {
                    list.retain(|f| f.name() != n);
                } else {
                    p.skipped("REMOVE of a filter needs the filter's name in the match");
                }
            }
            _ => {}
        }
    }
    for p in patches.iter().filter(|p| p.operation == Operation::Merge) {
        let name = anchor(p);
        let Some(value) = p.value_as::<F>() else {
            continue;
        };
        for f in list
            .iter_mut()
            .filter(|f| name.as_deref().is_none_or(|n| f.name() == n))
        {
            let Some(existing) = f.typed_config().cloned() else {
                continue;
            };
            if !value.name().is_empty() {
                f.set_name(value.name().to_string());
            }
            if let Some(src) = value.typed_config()
                && let Some(merged) = merge_typed_config(&existing, src, p)
            {
                f.set_typed_config(merged);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use envoy_types::pb::envoy::config::listener::v3::FilterChainMatch;
    use envoy_types::pb::google::protobuf::UInt32Value;

    use super::*;
    use crate::push_context::envoy_filters::compiled_for_tests as compiled;

    fn chain(name: &str, sni: &[&str], transport: &str, alpn: &[&str], port: u32) -> FilterChain {
        FilterChain {
            name: name.into(),
            filter_chain_match: Some(FilterChainMatch {
                server_names: sni.iter().map(|s| s.to_string()).collect(),
                transport_protocol: transport.into(),
                application_protocols: alpn.iter().map(|s| s.to_string()).collect(),
                destination_port: (port > 0).then_some(UInt32Value { value: port }),
                ..Default::default()
            }),
            filters: vec![Filter {
                name: "envoy.filters.network.tcp_proxy".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn listener() -> Listener {
        Listener {
            name: VIRTUAL_INBOUND.into(),
            filter_chains: vec![
                chain("tls-a", &["a.example"], "tls", &["h2", "http/1.1"], 8443),
                chain("plain", &[], "raw_buffer", &[], 8080),
            ],
            listener_filters: vec![ListenerFilter {
                name: "envoy.filters.listener.tls_inspector".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// The names of the chains a FILTER_CHAIN MERGE renaming them to `hit` reached.
    fn hit_by(filter_chain: &str) -> Vec<String> {
        let patches = compiled(&format!(
            "configPatches: [{{applyTo: FILTER_CHAIN, match: {{listener: {filter_chain}}}, patch: {{operation: MERGE, value: {{name: hit}}}}}}]"
        ));
        let refs: Vec<&CompiledPatch> = patches.iter().collect();
        let mut l = listener();
        assert!(patch_listener(&mut l, PatchContext::SidecarInbound, &refs));
        l.filter_chains.iter().map(|c| c.name.clone()).collect()
    }

    #[test]
    fn filter_chain_matches() {
        assert_eq!(hit_by("{filterChain: {sni: a.example}}"), ["hit", "plain"]);
        assert_eq!(
            hit_by("{filterChain: {sni: b.example}}"),
            ["tls-a", "plain"]
        );
        assert_eq!(
            hit_by("{filterChain: {transportProtocol: raw_buffer}}"),
            ["tls-a", "hit"]
        );
        assert_eq!(
            hit_by("{filterChain: {applicationProtocols: 'h2,http/1.1'}}"),
            ["hit", "plain"]
        );
        assert_eq!(
            hit_by("{filterChain: {applicationProtocols: 'h2,h3'}}"),
            ["tls-a", "plain"]
        );
        assert_eq!(
            hit_by("{filterChain: {destinationPort: 8080}}"),
            ["tls-a", "hit"]
        );
        assert_eq!(hit_by("{filterChain: {name: plain}}"), ["tls-a", "hit"]);
        // On a virtual listener the port is the chain's destination port.
        assert_eq!(hit_by("{portNumber: 8443}"), ["hit", "plain"]);
        assert_eq!(hit_by("{name: virtualOutbound}"), ["tls-a", "plain"]);
    }

    #[test]
    fn listener_filter_operations() {
        let patches = compiled(
            "configPatches:\n- {applyTo: LISTENER_FILTER, match: {listener: {listenerFilter: envoy.filters.listener.tls_inspector}}, patch: {operation: INSERT_AFTER, value: {name: envoy.filters.listener.http_inspector, typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.listener.http_inspector.v3.HttpInspector}}}}\n- {applyTo: LISTENER_FILTER, match: {listener: {listenerFilter: envoy.filters.listener.tls_inspector}}, patch: {operation: REMOVE}}\n",
        );
        let refs: Vec<&CompiledPatch> = patches.iter().collect();
        let mut l = listener();
        patch_listener(&mut l, PatchContext::SidecarInbound, &refs);
        let names: Vec<&str> = l.listener_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["envoy.filters.listener.http_inspector"]);
    }

    #[test]
    fn a_patch_of_another_context_does_nothing() {
        let patches = compiled(
            "configPatches: [{applyTo: LISTENER, match: {context: SIDECAR_OUTBOUND}, patch: {operation: REMOVE}}]",
        );
        let refs: Vec<&CompiledPatch> = patches.iter().collect();
        assert!(patch_listener(
            &mut listener(),
            PatchContext::SidecarInbound,
            &refs
        ));
        assert!(!patch_listener(
            &mut listener(),
            PatchContext::SidecarOutbound,
            &refs
        ));
    }
}
