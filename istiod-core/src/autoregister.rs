//! WorkloadEntry auto-registration (istiod's `pilot/pkg/autoregistration`): a proxy whose node
//! metadata names a WorkloadGroup (`AUTO_REGISTER_GROUP`, from the agent's
//! `ISTIO_META_AUTO_REGISTER_GROUP`) gets a WorkloadEntry made from the group's template with
//! its own address, written to the control plane's in-memory store while it is connected. When
//! its last stream ends the entry is removed after a grace period
//! (`PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`, 10 s), so a reconnecting proxy keeps its entry.
//!
//! Registering puts an address into every client's load balancing, so only a proxy that proved
//! the group's identity may do it: one embedded in the same process, or a peer whose mesh client
//! certificate (verified by TLS) is `spiffe://<trust domain>/ns/<group namespace>/sa/<template
//! service account>`. A plaintext or token-only peer cannot register (Istio likewise checks the
//! caller's identity against the group).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::Status;

use crate::config_store::{Metadata, Resource, WorkloadEntrySpec};
use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::store::MemoryStore;
use mesh_common::identity::Identity;

/// The group an auto-registered entry came from (Istio records it in an annotation of this
/// name; our metadata has labels only).
pub const GROUP_LABEL: &str = "istio.io/autoRegistrationGroup";

/// Who is on the other end of an xDS stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// In the same process (the agent's embedded control plane): trusted.
    InProcess,
    /// Over the network, with the identity of its verified client certificate, if any.
    Peer(Option<Identity>),
}

impl Caller {
    /// A network peer, by the certificate chain its TLS connection verified.
    pub fn peer(certs: Option<Arc<Vec<tonic::transport::CertificateDer<'static>>>>) -> Caller {
        Caller::Peer(crate::ca_server::peer_identity(certs).and_then(Result::ok))
    }
}

type Key = (String, String);

/// The registrations of one control plane.
pub struct AutoRegistration {
    memory: Arc<MemoryStore>,
    /// Grace period in milliseconds.
    grace_ms: std::sync::atomic::AtomicU64,
    /// Live streams per registered entry (namespace, name).
    live: Mutex<HashMap<Key, usize>>,
}

/// Held by a stream while its proxy is registered; dropping it starts the grace period.
pub struct Registration {
    owner: Arc<AutoRegistration>,
    key: Key,
}

impl AutoRegistration {
    pub fn new(memory: Arc<MemoryStore>, grace: Duration) -> Arc<Self> {
        Arc::new(AutoRegistration {
            memory,
            grace_ms: std::sync::atomic::AtomicU64::new(
                u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            ),
            live: Mutex::default(),
        })
    }

    /// How long an entry outlives its proxy's last stream.
    pub fn set_grace(&self, grace: Duration) {
        self.grace_ms.store(
            u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Registers `proxy` in the group its metadata names; `None` when it names none. Fails,
    /// and the stream with it, when the group does not exist or `caller` may not register in it.
    pub fn connect(
        self: &Arc<Self>,
        push: &PushContext,
        proxy: &Proxy,
        caller: &Caller,
    ) -> Result<Option<Registration>, Status> {
        let Some(group) = &proxy.auto_register_group else {
            return Ok(None);
        };
        let spec = push
            .config
            .resources
            .iter()
            .find_map(|r| match r {
                Resource::WorkloadGroup(m, s)
                    if m.name == *group && m.namespace() == proxy.namespace =>
                {
                    Some(s)
                }
                _ => None,
            })
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "auto-registration: no WorkloadGroup {}/{group}",
                    proxy.namespace
                ))
            })?;
        let account = spec
            .template
            .service_account
            .clone()
            .unwrap_or_else(|| "default".to_string());
        match caller {
            Caller::InProcess => {}
            Caller::Peer(Some(id))
                if id.trust_domain == push.trust_domain
                    && id.namespace == proxy.namespace
                    && id.service_account == account => {}
            Caller::Peer(id) => {
                return Err(Status::permission_denied(format!(
                    "auto-registration in WorkloadGroup {}/{group} needs the identity \
                     spiffe://{}/ns/{}/sa/{account} (a mesh client certificate); the caller has {}",
                    proxy.namespace,
                    push.trust_domain,
                    proxy.namespace,
                    id.as_ref().map_or("none".to_string(), ToString::to_string)
                )));
            }
        }
        let address = proxy
            .ip_addresses
            .first()
            .ok_or_else(|| Status::invalid_argument("auto-registration: the proxy has no IP"))?;
        let name = format!("{group}-{address}").replace(':', "-");
        let mut labels = spec.template.labels.clone();
        labels.extend(spec.metadata.labels.clone());
        labels.extend(proxy.labels.clone());
        let mut meta_labels = spec.metadata.labels.clone();
        meta_labels.insert(GROUP_LABEL.to_string(), group.clone());
        let entry = Resource::WorkloadEntry(
            Metadata {
                name: name.clone(),
                namespace: Some(proxy.namespace.clone()),
                labels: meta_labels,
                warnings: Vec::new(),
                ..Default::default()
            },
            WorkloadEntrySpec {
                address: address.to_string(),
                ports: spec.template.ports.clone(),
                labels,
                service_account: Some(account),
                locality: None,
                weight: None,
            },
        );
        let key = (proxy.namespace.clone(), name);
        if let Ok(mut live) = self.live.lock() {
            *live.entry(key.clone()).or_default() += 1;
        }
        tracing::info!(entry = %format!("{}/{}", key.0, key.1), %address, "auto-registered workload");
        self.memory.apply(entry);
        Ok(Some(Registration {
            owner: self.clone(),
            key,
        }))
    }

    fn disconnect(self: &Arc<Self>, key: Key) {
        let last = match self.live.lock() {
            Ok(mut live) => {
                let n = live.entry(key.clone()).or_default();
                *n = n.saturating_sub(1);
                *n == 0
            }
            Err(_) => false,
        };
        if !last {
            return;
        }
        let owner = self.clone();
        let remove = async move {
            tokio::time::sleep(owner.grace()).await;
            let still_gone = owner
                .live
                .lock()
                .map(|mut live| {
                    let gone = live.get(&key).is_none_or(|n| *n == 0);
                    if gone {
                        live.remove(&key);
                    }
                    gone
                })
                .unwrap_or(false);
            if still_gone && owner.memory.delete("WorkloadEntry", &key.0, &key.1) {
                tracing::info!(entry = %format!("{}/{}", key.0, key.1), "auto-registered workload removed");
            }
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(remove);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.owner.disconnect(self.key.clone());
    }
}
