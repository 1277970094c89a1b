//! Writes the Gateway API status (`crate::gateway_conversion::status`) back to the API server, as
//! istiod's gateway controller does, always on in Kubernetes mode (unlike `PILOT_ENABLE_STATUS`,
//! which is about Istio's own kinds): by the holder of the Lease `istio-status-leader` only, with
//! each condition's `observedGeneration` the object's generation, by server-side apply (field
//! manager `istio.io/gateway-controller`). A Gateway's addresses are those the load balancer gave
//! its Service `NAME-istio` (the one istiod's, and istiod-core's, deployment controller makes).
//! Unchanged statuses are not written again; a failed write is retried on the next pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;

use super::source::KubeSource;
use super::status::{LEASE_NAME, Leadership, RETRY_PERIOD};
use crate::config_store::gateway_api::GATEWAY_KIND;
use crate::gateway_conversion::status::{ObjectStatus, statuses};

/// The field manager of the writes (istiod's controller name).
const MANAGER: &str = "istio.io/gateway-controller";

/// Sets `observedGeneration` and `lastTransitionTime` on every condition of `status`.
fn stamp(status: &mut Value, generation: i64, now: &str) {
    match status {
        Value::Object(map) => {
            if map.contains_key("type") && map.contains_key("status") && map.contains_key("reason")
            {
                map.insert("observedGeneration".into(), generation.into());
                map.insert("lastTransitionTime".into(), now.into());
            }
            for v in map.values_mut() {
                stamp(v, generation, now);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| stamp(v, generation, now)),
        _ => {}
    }
}

/// The addresses the load balancer gave each Gateway's Service.
async fn service_addresses(
    client: &kube::Client,
    gateways: &[(String, String)],
) -> BTreeMap<(String, String), Vec<String>> {
    let mut out = BTreeMap::new();
    for (ns, name) in gateways {
        let api: Api<Service> = Api::namespaced(client.clone(), ns);
        let addrs = match api.get_opt(&format!("{name}-istio")).await {
            Ok(Some(svc)) => svc
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|i| i.ip.or(i.hostname))
                .collect(),
            _ => Vec::new(),
        };
        out.insert((ns.clone(), name.clone()), addrs);
    }
    out
}

/// Writes Gateway API status while holding the Lease; runs until the process ends.
pub async fn run(
    client: kube::Client,
    source: Arc<KubeSource>,
    namespace: String,
    identity: String,
    domain_suffix: String,
) {
    let mut lead = Leadership::new(
        client.clone(),
        &namespace,
        LEASE_NAME,
        identity,
        "writing Gateway API status",
    );
    let mut changes = source.subscribe();
    let mut written: BTreeMap<(&'static str, String, String), (super::source::Version, Value)> =
        BTreeMap::new();
    loop {
        let (leader, _) = lead.renew().await;
        if leader {
            write_changed(&client, &source, &domain_suffix, &mut written).await;
        } else {
            written.clear();
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY_PERIOD) => {}
            _ = changes.changed() => {}
        }
    }
}

async fn write_changed(
    client: &kube::Client,
    source: &KubeSource,
    domain_suffix: &str,
    written: &mut BTreeMap<(&'static str, String, String), (super::source::Version, Value)>,
) {
    let resources = match crate::store::ConfigStore::list(source) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "Gateway API status: cannot list the config");
            return;
        }
    };
    let gateways: Vec<(String, String)> = resources
        .iter()
        .filter(|r| r.kind() == GATEWAY_KIND)
        .map(|r| {
            (
                r.metadata().namespace().to_string(),
                r.metadata().name.clone(),
            )
        })
        .collect();
    let addresses = service_addresses(client, &gateways).await;
    let no_address = Vec::new();
    let all: Vec<ObjectStatus> = statuses(&resources, domain_suffix, &|ns, name| {
        addresses
            .get(&(ns.to_string(), name.to_string()))
            .unwrap_or(&no_address)
            .clone()
    });
    let generations = source.generations();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    for o in all {
        let key_ns = if o.kind == "GatewayClass" {
            "default".to_string()
        } else {
            o.namespace.clone()
        };
        let version = generations
            .get(&(o.kind.to_string(), key_ns, o.name.clone()))
            .cloned()
            .unwrap_or_default();
        let key = (o.kind, o.namespace.clone(), o.name.clone());
        // Written already for this object (an object created again has another uid).
        if written.get(&key) == Some(&(version.clone(), o.status.clone())) {
            continue;
        }
        let mut status = o.status.clone();
        stamp(&mut status, version.generation, &now);
        // The API resource as the source watches the kind.
        let Some(ar) = source.kind_keyed(o.kind).map(|k| k.api_resource()) else {
            continue;
        };
        let api: Api<DynamicObject> = if o.namespace.is_empty() {
            Api::all_with(client.clone(), &ar)
        } else {
            Api::namespaced_with(client.clone(), &o.namespace, &ar)
        };
        let body =
            serde_json::json!({"apiVersion": ar.api_version, "kind": ar.kind, "status": status});
        match api
            .patch_status(
                &o.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(body),
            )
            .await
        {
            Ok(_) => {
                written.insert(key, (version, o.status));
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(
                object = %format!("{} {}/{}", o.kind, o.namespace, o.name),
                error = %e,
                "Gateway API status: cannot write"
            ),
        }
    }
}
