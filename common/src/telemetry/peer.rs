//! Who is at the other end of an HTTP request, for the standard metrics' peer labels (Istio's
//! metadata exchange, which upstream Envoy does not have). Each sidecar announces its own
//! workload in the header [`HEADER`]: a client on its requests, a server on its responses; the
//! other side's Envoy moves the header into dynamic metadata (`istio.peer`), out of the
//! message, so neither app sees it, and its access logger reports it to the agent. The agent
//! believes an announcement only when its namespace and service account are those of the
//! peer's certificate on that connection (Istio's exchange trusts the header as it comes).
//!
//! The value is the agent's: Envoy reads it from the environment variable [`ENV`] that the
//! agent sets, so these filters are the same for every proxy. TCP has no exchange here: its
//! peers stay `unknown` but for what the certificate says.

use envoy_types::pb::envoy::config::common::mutation_rules::v3::{
    HeaderMutation as Mutation, header_mutation,
};
use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, header_value_option,
};
use envoy_types::pb::envoy::extensions::filters::http::header_mutation::v3::{
    HeaderMutation, Mutations,
};
use envoy_types::pb::envoy::extensions::filters::http::header_to_metadata::v3::{Config, config};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::util::pack_any;

/// The header a sidecar announces its workload in.
pub const HEADER: &str = "x-istio-peer";
/// The environment variable of Envoy's that holds the announcement (set by the agent).
pub const ENV: &str = "ISTIO_PEER";
/// Where the peer's announcement goes: dynamic metadata `istio.peer`, key `peer`.
pub const METADATA_NAMESPACE: &str = "istio.peer";
pub const METADATA_KEY: &str = "peer";
/// The access-log command that reads it.
pub const COMMAND: &str = "%DYNAMIC_METADATA(istio.peer:peer)%";

const ANNOUNCE: &str = "istio.peer.announce";
const LEARN: &str = "istio.peer.learn";

fn announce(on_request: bool) -> HttpFilter {
    let add = Mutation {
        action: Some(header_mutation::Action::Append(HeaderValueOption {
            header: Some(HeaderValue {
                key: HEADER.to_string(),
                value: format!("%ENVIRONMENT({ENV})%"),
                ..Default::default()
            }),
            append_action: header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..Default::default()
        })),
    };
    let mutations = if on_request {
        Mutations {
            request_mutations: vec![add],
            ..Default::default()
        }
    } else {
        Mutations {
            response_mutations: vec![add],
            ..Default::default()
        }
    };
    HttpFilter {
        name: ANNOUNCE.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            HeaderMutation {
                mutations: Some(mutations),
                ..Default::default()
            },
        ))),
        ..Default::default()
    }
}

fn learn(from_request: bool) -> HttpFilter {
    let rule = config::Rule {
        header: HEADER.to_string(),
        on_header_present: Some(config::KeyValuePair {
            metadata_namespace: METADATA_NAMESPACE.to_string(),
            key: METADATA_KEY.to_string(),
            ..Default::default()
        }),
        remove: true,
        ..Default::default()
    };
    let config = if from_request {
        Config {
            request_rules: vec![rule],
            ..Default::default()
        }
    } else {
        Config {
            response_rules: vec![rule],
            ..Default::default()
        }
    };
    HttpFilter {
        name: LEARN.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(config))),
        ..Default::default()
    }
}

/// The filters of a connection manager, to go before its router: a client's (`client`)
/// announces itself on requests and learns the server from the response; a server's learns the
/// client from the request (the header removed before the app) and announces itself on the
/// response.
pub fn filters(client: bool) -> [HttpFilter; 2] {
    if client {
        [learn(false), announce(true)]
    } else {
        [learn(true), announce(false)]
    }
}

/// Whether `name` is one of these filters (a connection manager gets them once).
pub fn is_peer_filter(name: &str) -> bool {
    name == ANNOUNCE || name == LEARN
}
