//! The record of auto-allocated addresses (Istio's IP allocation controller,
//! `pilot/pkg/controllers/ipallocate`): each ServiceEntry whose hosts were given addresses
//! (`push_context::auto_ip`) gets them in `status.addresses` (`[{host, value}]`, one per host
//! and family), so every replica, and this one after a restart, keeps them. One replica writes
//! at a time: the holder of the Lease `istio-ip-autoallocate` (istiod's election of the same
//! name). Only `status.addresses` is written (server-side apply, a field manager of its own), so
//! the `Reconciled` condition `kube::status` writes is left alone; an entry that no longer
//! qualifies gets its addresses cleared.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use tokio::sync::watch;

use super::source::KubeSource;
use super::status::{Leadership, RETRY_PERIOD};
use crate::push_context::PushContext;

/// istiod's lock for allocating addresses.
pub const LEASE_NAME: &str = "istio-ip-autoallocate";
/// The field manager of the writes.
const MANAGER: &str = "istiod-core-ip-autoallocate";

/// The addresses `push` gives the hosts of the ServiceEntry `namespace/name`: `(host, address)`.
fn allocated(push: &PushContext, namespace: &str, name: &str) -> Vec<(String, IpAddr)> {
    push.services
        .iter()
        .filter(|s| {
            s.registry == crate::model::Registry::External
                && s.namespace == namespace
                && s.source_name == name
        })
        .flat_map(|s| s.auto_addresses.iter().map(|a| (s.hostname.clone(), *a)))
        .collect()
}

/// `status.addresses` of a ServiceEntry, in istiod's shape.
fn status_of(api_version: &str, addresses: &[(String, IpAddr)]) -> serde_json::Value {
    let list: Vec<serde_json::Value> = addresses
        .iter()
        .map(|(host, a)| serde_json::json!({"host": host, "value": a.to_string()}))
        .collect();
    serde_json::json!({
        "apiVersion": api_version,
        "kind": "ServiceEntry",
        "status": {"addresses": list},
    })
}

/// Writes the addresses of each new snapshot (`snapshots`, the control plane's) while holding
/// the Lease; runs until the process ends.
pub async fn run(
    client: kube::Client,
    source: Arc<KubeSource>,
    namespace: String,
    identity: String,
    mut snapshots: watch::Receiver<Arc<PushContext>>,
) {
    let mut lead = Leadership::new(
        client.clone(),
        &namespace,
        LEASE_NAME,
        identity,
        "recording allocated addresses",
    );
    let mut written: BTreeMap<(String, String), Vec<(String, IpAddr)>> = BTreeMap::new();
    loop {
        let (leader, fresh) = lead.renew().await;
        if fresh {
            written.clear();
        }
        if leader {
            let push = snapshots.borrow_and_update().clone();
            write_changed(&client, &source, &push, &mut written).await;
        }
        // The next renewal, or sooner when a new snapshot is in force.
        tokio::select! {
            _ = tokio::time::sleep(RETRY_PERIOD) => {}
            _ = snapshots.changed(), if leader => {}
        }
    }
}

async fn write_changed(
    client: &kube::Client,
    source: &KubeSource,
    push: &PushContext,
    written: &mut BTreeMap<(String, String), Vec<(String, IpAddr)>>,
) {
    let entries: Vec<_> = source
        .istio_statuses()
        .into_iter()
        .filter(|o| o.kind.kind == "ServiceEntry" && o.refused.is_none())
        .collect();
    written.retain(|(ns, name), _| {
        entries
            .iter()
            .any(|o| &o.namespace == ns && &o.name == name)
    });
    for o in entries {
        let key = (o.namespace.clone(), o.name.clone());
        let want = allocated(push, &o.namespace, &o.name);
        if written.get(&key) == Some(&want) {
            continue;
        }
        let api = o.kind.api(client.clone(), &o.namespace);
        let params = PatchParams::apply(MANAGER).force();
        let body = status_of(&o.kind.api_resource_version(), &want);
        match api
            .patch_status(&o.name, &params, &Patch::Apply(body))
            .await
        {
            Ok(_) => {
                tracing::info!(entry = %format!("{}/{}", key.0, key.1), addresses = ?want, "allocated addresses recorded");
                written.insert(key, want);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(entry = %format!("{}/{}", key.0, key.1), error = %e, "cannot record its addresses");
            }
        }
    }
}
