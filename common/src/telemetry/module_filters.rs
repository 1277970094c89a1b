//! The Envoy config that puts the proxy module's filters ([`crate::module`]) into listeners:
//! one builder for an HTTP filter and one for a network filter, each carrying its config as a
//! `google.protobuf.StringValue` of JSON (Envoy 1.40 hands the module the string) or as a
//! `google.protobuf.Struct` (Envoy hands the module its JSON). A `TypedStruct` is not unwrapped:
//! Envoy 1.40 hands the module its protobuf bytes, so the agent passes an istiod TypedStruct's
//! inner Struct.

use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
use envoy_types::pb::envoy::extensions::dynamic_modules::v3::DynamicModuleConfig;
use envoy_types::pb::envoy::extensions::filters::http::dynamic_modules::v3::DynamicModuleFilter;
use envoy_types::pb::envoy::extensions::filters::network::dynamic_modules::v3::DynamicModuleNetworkFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::google::protobuf::{Any, StringValue};
use envoy_types::util::pack_any;

use crate::module::{METRICS_NAMESPACE, NAME};

/// The type URL of the HTTP filter's config.
pub const HTTP_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
/// The type URL of the network filter's config.
pub const NETWORK_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.dynamic_modules.v3.DynamicModuleNetworkFilter";

fn module() -> DynamicModuleConfig {
    DynamicModuleConfig {
        name: NAME.to_string(),
        // Loaded once and kept: every listener update would otherwise unload and load it.
        do_not_close: true,
        metrics_namespace: METRICS_NAMESPACE.to_string(),
        ..Default::default()
    }
}

/// A config as Envoy passes it to the module: `json` as a StringValue.
pub fn json_config(json: &impl serde::Serialize) -> Any {
    pack_any(StringValue {
        value: serde_json::to_string(json).unwrap_or_else(|_| "{}".to_string()),
    })
}

/// The module's config for HTTP filter `filter_name` (a [`crate::module::filter`] name).
pub fn http_config(filter_name: &str, config: Any) -> Any {
    pack_any(DynamicModuleFilter {
        dynamic_module_config: Some(module()),
        filter_name: filter_name.to_string(),
        filter_config: Some(config),
        terminal_filter: false,
    })
}

/// The module's HTTP filter `filter_name`, named as Istio names its own.
pub fn http_filter(filter_name: &str, config: Any) -> HttpFilter {
    HttpFilter {
        name: filter_name.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(http_config(
            filter_name,
            config,
        ))),
        ..Default::default()
    }
}

/// The module's config for network filter `filter_name`.
pub fn network_config(filter_name: &str, config: Any) -> Any {
    pack_any(DynamicModuleNetworkFilter {
        dynamic_module_config: Some(module()),
        filter_name: filter_name.to_string(),
        filter_config: Some(config),
        terminal_filter: false,
    })
}

/// The module's network filter `filter_name`.
pub fn network_filter(filter_name: &str, config: Any) -> Filter {
    Filter {
        name: filter_name.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(network_config(
            filter_name,
            config,
        ))),
    }
}

/// Whether an HTTP or network filter's typed config is one of the module's.
pub fn is_module_config(type_url: &str) -> bool {
    type_url == HTTP_TYPE || type_url == NETWORK_TYPE
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use prost::Message;

    use super::*;
    use crate::module::{PeerMetadata, filter};

    #[test]
    fn filters_name_the_module_and_carry_json() {
        let f = http_filter(
            filter::METADATA_EXCHANGE,
            json_config(&PeerMetadata::client()),
        );
        let Some(http_filter::ConfigType::TypedConfig(any)) = f.config_type else {
            panic!("no typed config");
        };
        assert_eq!(any.type_url, HTTP_TYPE);
        let m = DynamicModuleFilter::decode(any.value.as_slice()).unwrap();
        assert_eq!(m.dynamic_module_config.unwrap().name, "istio_module");
        let json = StringValue::decode(m.filter_config.unwrap().value.as_slice()).unwrap();
        assert!(json.value.contains("upstream_discovery"));
        assert_eq!(
            network_config(filter::STATS, json_config(&crate::module::Stats::default())).type_url,
            NETWORK_TYPE
        );
    }
}
