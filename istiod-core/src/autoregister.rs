//! WorkloadEntry auto-registration (istiod's `pilot/pkg/autoregistration`): a proxy whose node
//! metadata names a WorkloadGroup (`AUTO_REGISTER_GROUP`, from the agent's
//! `ISTIO_META_AUTO_REGISTER_GROUP`) gets a WorkloadEntry made from the group's template with
//! its own address, written to the control plane's in-memory store while it is connected. When
//! its last stream ends the entry is removed after a grace period
//! (`PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`, 10 s), so a reconnecting proxy keeps its entry.
//!
//! Health, as istiod's health controller: a proxy whose ProxyConfig has a `readinessProbe`
//! (node metadata `PROXY_CONFIG`) reports its workload's health on its xDS stream
//! (`istio.v1.HealthInformation` requests: healthy without `error_detail`, unhealthy with it).
//! Its entry is an endpoint only while the last report said healthy; until the first report it
//! is not (Istio: "newly created WorkloadEntries are treated as unhealthy until we prove they
//! are healthy"). A reconnection within the grace period keeps the last report.
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
    /// Registered entries (namespace, name): their streams and health.
    live: Mutex<HashMap<Key, Live>>,
}

/// One registered entry.
struct Live {
    streams: usize,
    entry: Resource,
    /// Health-checked (the proxy has a readiness probe): published only while healthy.
    checked: bool,
    /// The last report: healthy, and the reason when not; `None` before the first.
    health: Option<(bool, String)>,
}

impl Live {
    fn published(&self) -> bool {
        !self.checked || self.health.as_ref().is_some_and(|(ok, _)| *ok)
    }
}

/// The health of an auto-registered entry, as istiod's `Healthy` condition says it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EntryHealth {
    pub namespace: String,
    pub name: String,
    pub address: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub service_account: String,
    /// Its proxy reports health (a readiness probe); otherwise always an endpoint.
    pub checked: bool,
    /// The last report (healthy, message when not); `None` before the first.
    pub health: Option<(bool, String)>,
    /// Whether it is an endpoint now.
    pub published: bool,
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
        // Istio's name: the group, the address, and the proxy's network when it names one.
        let name = match proxy.network() {
            "" => format!("{group}-{address}"),
            net => format!("{group}-{address}-{net}"),
        }
        .replace(':', "-");
        let network = Some(proxy.network())
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .or_else(|| spec.template.network.clone())
            .filter(|n| !n.is_empty())
            .map(Box::new);
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
                network,
            },
        );
        let key = (proxy.namespace.clone(), name);
        let published = match self.live.lock() {
            Ok(mut live) => {
                let l = live.entry(key.clone()).or_insert_with(|| Live {
                    streams: 0,
                    entry: entry.clone(),
                    checked: proxy.health_checked,
                    health: None,
                });
                l.streams += 1;
                l.entry = entry.clone();
                l.checked = proxy.health_checked;
                l.published()
            }
            Err(_) => true,
        };
        tracing::info!(
            entry = %format!("{}/{}", key.0, key.1),
            %address,
            health_checked = proxy.health_checked,
            "auto-registered workload"
        );
        self.publish(&key, published.then_some(entry));
        Ok(Some(Registration {
            owner: self.clone(),
            key,
        }))
    }

    /// Puts the entry into the store, or takes it out (`None`).
    fn publish(&self, key: &Key, entry: Option<Resource>) {
        match entry {
            Some(entry) => self.memory.apply(entry),
            None => {
                self.memory.delete("WorkloadEntry", &key.0, &key.1);
            }
        }
    }

    /// The registered entries and their health (`/debug/registrationz`, tests).
    pub fn entries(&self) -> Vec<EntryHealth> {
        let Ok(live) = self.live.lock() else {
            return Vec::new();
        };
        let mut out: Vec<EntryHealth> = live
            .iter()
            .map(|((namespace, name), l)| EntryHealth {
                namespace: namespace.clone(),
                name: name.clone(),
                address: spec_of(&l.entry)
                    .map(|s| s.address.clone())
                    .unwrap_or_default(),
                labels: spec_of(&l.entry)
                    .map(|s| s.labels.clone().into_iter().collect())
                    .unwrap_or_default(),
                service_account: spec_of(&l.entry)
                    .and_then(|s| s.service_account.clone())
                    .unwrap_or_default(),
                checked: l.checked,
                health: l.health.clone(),
                published: l.published(),
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    fn report(&self, key: &Key, healthy: bool, message: String) {
        // Whether the verdict changed, and the store's change if publication did (the entry, or
        // None to take it out).
        let (changed, publish) = match self.live.lock() {
            Ok(mut live) => {
                let Some(l) = live.get_mut(key) else {
                    return;
                };
                let before = l.published();
                let changed = l.health.as_ref().map(|(ok, _)| *ok) != Some(healthy);
                l.health = Some((healthy, message.clone()));
                let after = l.published();
                (
                    changed,
                    (before != after).then(|| after.then(|| l.entry.clone())),
                )
            }
            Err(_) => return,
        };
        if changed {
            tracing::info!(
                entry = %format!("{}/{}", key.0, key.1),
                healthy,
                message = %message,
                "workload health"
            );
        }
        if let Some(entry) = publish {
            self.publish(key, entry);
        }
    }

    fn disconnect(self: &Arc<Self>, key: Key) {
        let last = match self.live.lock() {
            Ok(mut live) => match live.get_mut(&key) {
                Some(l) => {
                    l.streams = l.streams.saturating_sub(1);
                    l.streams == 0
                }
                None => false,
            },
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
                    let gone = live.get(&key).is_none_or(|l| l.streams == 0);
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

fn spec_of(r: &Resource) -> Option<&WorkloadEntrySpec> {
    match r {
        Resource::WorkloadEntry(_, spec) => Some(spec),
        _ => None,
    }
}

impl Registration {
    /// A health report of the registered proxy (`istio.v1.HealthInformation`): healthy, or
    /// not with the reason.
    pub fn report(&self, healthy: bool, message: String) {
        self.owner.report(&self.key, healthy, message);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.owner.disconnect(self.key.clone());
    }
}
