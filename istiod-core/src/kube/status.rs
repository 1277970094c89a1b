//! Config status on Istio's objects (istiod's `PILOT_ENABLE_STATUS`): each Istio object the
//! Kubernetes source holds gets `status.observedGeneration` and a `Reconciled` condition, `True`
//! when it is in force, `False` with the reason when it was refused (its last good version, if
//! any, still in force), so `kubectl get -o yaml` says why an edit did nothing. One replica
//! writes at a time: the holder of the Lease `istio-status-leader` in istiod's namespace (istiod's
//! election of the same name), renewed every 2 s and taken over 15 s after its holder stops.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::source::{KubeSource, ObjectStatus};

/// istiod's lock for writing status.
pub const LEASE_NAME: &str = "istio-status-leader";
/// How long a holder that stopped renewing keeps the Lease (client-go's default).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews, and a candidate tries.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// The field manager of the status writes.
const MANAGER: &str = "istiod-core";

/// The Lease `lease_name` of `identity`: whether it holds it now (after creating, renewing or taking it
/// over), or why it could not tell.
pub async fn hold_lease(
    leases: &Api<Lease>,
    lease_name: &str,
    identity: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<bool, kube::Error> {
    let duration = i32::try_from(LEASE_DURATION.as_secs()).unwrap_or(15);
    let mine = |transitions: i32, acquired: Option<MicroTime>| {
        serde_json::json!({
            "holderIdentity": identity,
            "leaseDurationSeconds": duration,
            "acquireTime": acquired.unwrap_or(MicroTime(now)),
            "renewTime": MicroTime(now),
            "leaseTransitions": transitions,
        })
    };
    let Some(mut lease) = leases.get_opt(lease_name).await? else {
        let fresh: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": lease_name},
            "spec": mine(0, None),
        }))
        .map_err(kube::Error::SerdeError)?;
        return match leases.create(&PostParams::default(), &fresh).await {
            Ok(_) => Ok(true),
            // Another replica created it first.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let held_by_me = spec.holder_identity.as_deref() == Some(identity);
    let expired = spec.renew_time.as_ref().is_none_or(|t| {
        let held = i64::from(spec.lease_duration_seconds.unwrap_or(duration));
        now.as_second() > t.0.as_second() + held
    });
    if !held_by_me && !expired {
        return Ok(false);
    }
    let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!held_by_me);
    let acquired = if held_by_me { spec.acquire_time } else { None };
    lease.spec =
        Some(serde_json::from_value(mine(transitions, acquired)).map_err(kube::Error::SerdeError)?);
    // The resourceVersion read makes this a compare-and-swap: of two candidates one wins.
    match leases
        .replace(lease_name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The status an object should have.
fn status_of(o: &ObjectStatus) -> serde_json::Value {
    let (status, reason, message) = match &o.refused {
        None => ("True", "Accepted", "in force".to_string()),
        Some(why) => ("False", "Refused", why.clone()),
    };
    serde_json::json!({
        "apiVersion": o.kind.api_resource_version(),
        "kind": o.kind.kind,
        "status": {
            "observedGeneration": o.version.generation,
            "conditions": [{
                "type": "Reconciled",
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            }],
        },
    })
}

/// One replica's part in a Lease election: renewed (or taken) on each call, saying when it
/// starts and stops leading.
pub struct Leadership {
    leases: Api<Lease>,
    lease: &'static str,
    identity: String,
    /// What the leader does, for the log (`writing config status`).
    duty: &'static str,
    leading: bool,
}

impl Leadership {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        lease: &'static str,
        identity: String,
        duty: &'static str,
    ) -> Leadership {
        Leadership {
            leases: Api::namespaced(client, namespace),
            lease,
            identity,
            duty,
            leading: false,
        }
    }

    /// Renews or takes the Lease: (leading now, this call made it the leader). An API error
    /// counts as not leading.
    pub async fn renew(&mut self) -> (bool, bool) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let was = self.leading;
        self.leading = match hold_lease(&self.leases, self.lease, &self.identity, now).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(lease = self.lease, error = %e, "cannot read or renew the Lease");
                false
            }
        };
        match (was, self.leading) {
            (false, true) => {
                tracing::info!(lease = self.lease, identity = %self.identity, "leading: {}", self.duty)
            }
            (true, false) => {
                tracing::info!(
                    lease = self.lease,
                    "no longer leading: {} left to the holder",
                    self.duty
                )
            }
            _ => {}
        }
        (self.leading, self.leading && !was)
    }
}

/// Writes status while holding the Lease; runs until the process ends.
pub async fn run(
    client: kube::Client,
    source: Arc<KubeSource>,
    namespace: String,
    identity: String,
) {
    let mut lead = Leadership::new(
        client.clone(),
        &namespace,
        LEASE_NAME,
        identity,
        "writing config status",
    );
    let mut changes = source.subscribe();
    // What was written, so an unchanged object is not written again.
    let mut written: Written = BTreeMap::new();
    loop {
        let (leading, fresh) = lead.renew().await;
        if fresh {
            written.clear();
        }
        if leading {
            write_changed(&client, &source, &mut written).await;
        }
        // The next renewal, or sooner when the config changed (written only while leading).
        tokio::select! {
            _ = tokio::time::sleep(RETRY_PERIOD) => {}
            _ = changes.changed(), if leading => {}
        }
    }
}

/// What was written per object: its version and refusal.
type Written = BTreeMap<(String, String, String), (super::source::Version, Option<String>)>;

async fn write_changed(client: &kube::Client, source: &KubeSource, written: &mut Written) {
    let now = source.istio_statuses();
    let present: std::collections::BTreeSet<(String, String, String)> = now
        .iter()
        .map(|o| (o.kind.kind.to_string(), o.namespace.clone(), o.name.clone()))
        .collect();
    written.retain(|k, _| present.contains(k));
    for o in now {
        let key = (o.kind.kind.to_string(), o.namespace.clone(), o.name.clone());
        let want = (o.version.clone(), o.refused.clone());
        if written.get(&key) == Some(&want) {
            continue;
        }
        let api = o.kind.api(client.clone(), &o.namespace);
        let params = PatchParams::apply(MANAGER).force();
        match api
            .patch_status(&o.name, &params, &Patch::Apply(status_of(&o)))
            .await
        {
            Ok(_) => {
                written.insert(key, want);
            }
            // Deleted meanwhile: the next listing will not have it.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(object = %format!("{} {}/{}", key.0, key.1, key.2), error = %e, "cannot write its status");
            }
        }
    }
}
