//! The PushContext: an immutable snapshot of everything the generators read, rebuilt from config
//! on every change and shared with all streams through a `watch` channel (istiod's
//! `pilot/pkg/model/push_context.go`). Generators never see a half-updated mesh.

use crate::config_store::ConfigSet;
use crate::model::Service;
use crate::registry::{self, RegistryError};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushContext {
    /// Changes on every rebuild; sent as the xDS `version_info`.
    pub version: String,
    pub services: Vec<Service>,
}

impl PushContext {
    pub fn build(
        config: &ConfigSet,
        domain_suffix: &str,
        version: String,
    ) -> Result<Self, RegistryError> {
        Ok(PushContext {
            version,
            services: registry::services(config, domain_suffix)?,
        })
    }
}
