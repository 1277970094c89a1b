//! The settings of the control plane the agent embeds (istiod-core in process, the default
//! without a discoveryAddress): istiod's own environment variables, parsed by istiod-core's
//! config so the agent and `istiod-core serve` read them the same way.

use istiod_core::config::EnvError;

use super::{ConfigError, err};

pub use istiod_core::Debounce;

/// What the embedded control plane is given besides its config directory and mesh file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmbeddedSettings {
    /// PILOT_DEBOUNCE_AFTER/MAX for the config watch.
    pub debounce: Debounce,
    /// ISTIOD_CACHE_CHECK: the generator cache is checked (a test aid).
    pub cache_check: bool,
    /// PILOT_SCOPE_GATEWAY_TO_NAMESPACE.
    pub scope_gateway_to_namespace: bool,
}

/// An error of the embedded control plane's env vars, as the agent reports it.
fn env_error(e: EnvError) -> ConfigError {
    err(e.name, &e.value, &e.expected)
}

impl EmbeddedSettings {
    pub fn from_env(
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<EmbeddedSettings, ConfigError> {
        use istiod_core::config as pilot;
        Ok(EmbeddedSettings {
            debounce: pilot::debounce(lookup).map_err(env_error)?,
            cache_check: pilot::cache_check(lookup).map_err(env_error)?,
            scope_gateway_to_namespace: pilot::scope_gateway_to_namespace(lookup)
                .map_err(env_error)?,
        })
    }
}
