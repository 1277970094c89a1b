//! Locality load balancing, as istiod applies it to a proxy's endpoint assignments
//! (`pilot/pkg/networking/core/loadbalancer/loadbalancer.go`, `endpoint_builder.go`):
//! - the setting in force for a cluster is its DestinationRule's `localityLbSetting` (resolved
//!   for the port and subset as the rest of its traffic policy), else the mesh's, else Istio's
//!   default (on, no lists); `enabled: false` at the level chosen turns it off;
//! - `distribute` (whatever the outlier detection): the first `from` matching the proxy's
//!   locality shares each `to` percentage among the localities it matches, in proportion to
//!   their weights (rounded up); localities no `to` matches keep their place but no endpoint;
//! - else, only when the cluster's policy has outlier detection, failover by priority: with
//!   `failoverPriority` (and proxy labels), endpoints whose labels match the proxy's on every
//!   listed label first, then those matching fewer leading labels (`label=value` compares with
//!   `value`; a leading `topology.istio.io/network` only ranks networks); without it, or with a
//!   `failover` list too, by locality: same region, zone and subzone 0, same zone 1, same region
//!   2, other regions 3, and 4 for regions other than the `to` of the first `failover` entry
//!   from the proxy's region; label tiers before locality tiers; the priorities are then
//!   numbered from 0 without gaps;
//! - the cluster gets `locality_weighted_lb_config` for `distribute`, or for failover with a
//!   `failover` or `failoverPriority` list.
//!
//! An assignment depends on the proxy's locality (and for `failoverPriority` its labels): the
//! snapshot's cache keeps one per cluster and such key.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LocalityLbEndpoints};
use envoy_types::pb::google::protobuf::UInt32Value;

use crate::config_store::destination_rule::LoadBalancer;
use crate::config_store::locality::{LocalityLbSetting, MESH_DEFAULT};
use crate::model::{Endpoint, Proxy, Service};
use crate::push_context::{AppliedRule, PushContext};

/// What locality load balancing does to one cluster.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    pub setting: &'a LocalityLbSetting,
    /// The cluster's policy has outlier detection: failover applies.
    pub failover: bool,
}

impl Plan<'_> {
    /// Whether the cluster gets `common_lb_config.locality_weighted_lb_config`.
    pub fn weighted(&self) -> bool {
        !self.setting.distribute.is_empty() || (self.failover && self.setting.fails_over())
    }

    /// Whether the assignment depends on the proxy's labels, not only its locality.
    fn by_labels(&self) -> bool {
        self.setting.distribute.is_empty()
            && self.failover
            && !self.setting.failover_priority.is_empty()
    }
}

/// The setting in force under a cluster's `loadBalancer` (None: off).
fn setting<'a>(
    push: &'a PushContext,
    lb: Option<&'a LoadBalancer>,
) -> Option<&'a LocalityLbSetting> {
    let s = lb
        .and_then(|lb| lb.locality_lb_setting.as_ref())
        .or(push.mesh.locality_lb_setting.as_ref())
        .unwrap_or(&MESH_DEFAULT);
    (s.enabled != Some(false)).then_some(s)
}

/// The plan for the cluster of `svc`'s `port` (and `subset`); None when the assignment is the
/// same for every proxy.
pub fn plan<'a>(
    push: &'a PushContext,
    svc: &Service,
    port: u16,
    subset: Option<&str>,
) -> Option<Plan<'a>> {
    let policy = push
        .destination_rules
        .get(&svc.hostname)
        .map(|rule: &std::sync::Arc<AppliedRule>| {
            super::cluster_policy::effective(rule, subset, port)
        })
        .unwrap_or_default();
    plan_for(push, &policy)
}

/// The plan under a cluster's traffic policy `policy` (its DestinationRule's for the port and
/// subset, `cluster_policy::effective`).
pub fn plan_for<'a>(
    push: &'a PushContext,
    policy: &super::cluster_policy::Effective<'a>,
) -> Option<Plan<'a>> {
    let setting = setting(push, policy.load_balancer)?;
    let failover = policy.outlier_detection.is_some();
    (!setting.distribute.is_empty() || failover).then_some(Plan { setting, failover })
}

/// A `region/zone/subzone` as its three parts (missing ones empty).
fn parts(locality: &str) -> [&str; 3] {
    let mut it = locality.splitn(3, '/');
    [(); 3].map(|_| it.next().unwrap_or_default())
}

/// Istio's `LocalityMatch`: `rule` (`region[/zone[/subzone]]`, `*` for any) takes in `locality`.
fn matches(locality: &str, rule: &str) -> bool {
    let l = parts(locality);
    rule.split('/')
        .take(3)
        .enumerate()
        .all(|(i, r)| r == "*" || r == l[i])
}

/// The proxy's locality: its workload's in the registry (a pod's, a WorkloadEntry's), else
/// what it says itself.
pub fn proxy_locality(push: &PushContext, proxy: &Proxy) -> String {
    push.services
        .iter()
        .flat_map(|s| &s.endpoints)
        .find(|e| proxy.owns(e) && !e.locality.is_empty())
        .map(|e| e.locality.clone())
        .unwrap_or_else(|| proxy.locality.clone())
}

/// The proxy's labels with istiod's topology labels, as `failoverPriority` compares them.
pub fn proxy_labels(push: &PushContext, proxy: &Proxy, locality: &str) -> BTreeMap<String, String> {
    let cluster = proxy
        .metadata
        .get("CLUSTER_ID")
        .map(String::as_str)
        .unwrap_or(&push.cluster_id);
    let node = proxy
        .metadata
        .get("NODE_NAME")
        .map(String::as_str)
        .unwrap_or_default();
    crate::model::augmented_labels(
        &proxy.workload_labels(&push.services),
        locality,
        cluster,
        node,
    )
}

/// The cache key of a proxy's assignment of a planned cluster: what it depends on.
pub fn key(plan: &Plan, locality: &str, labels: &BTreeMap<String, String>) -> String {
    let mut key = locality.to_string();
    if plan.by_labels() {
        for l in &plan.setting.failover_priority {
            let name = l.split_once('=').map_or(l.as_str(), |(n, _)| n);
            key.push('\0');
            key.push_str(labels.get(name).map(String::as_str).unwrap_or_default());
        }
    }
    key
}

/// One endpoint of an assignment with what locality load balancing reads of it.
pub struct Member<'a> {
    pub endpoint: &'a Endpoint,
    pub lb: envoy_types::pb::envoy::config::endpoint::v3::LbEndpoint,
}

/// `members` grouped by locality and priority into `LocalityLbEndpoints`, sorted by locality
/// then priority; a group's weight is the sum of its endpoints'.
pub fn group<'a>(members: impl IntoIterator<Item = (Member<'a>, u32)>) -> Vec<LocalityLbEndpoints> {
    let mut groups: BTreeMap<(&str, u32), Vec<_>> = BTreeMap::new();
    for (m, priority) in members {
        groups
            .entry((m.endpoint.locality.as_str(), priority))
            .or_default()
            .push(m.lb);
    }
    groups
        .into_iter()
        .map(|((locality, priority), lb_endpoints)| {
            let weight = lb_endpoints
                .iter()
                .map(|e| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
                .fold(0u32, u32::saturating_add);
            LocalityLbEndpoints {
                locality: envoy_locality(locality),
                load_balancing_weight: Some(UInt32Value { value: weight }),
                priority,
                lb_endpoints,
                ..Default::default()
            }
        })
        .collect()
}

/// Envoy's locality of `region/zone/subzone` (none for an empty one).
fn envoy_locality(locality: &str) -> Option<envoy_types::pb::envoy::config::core::v3::Locality> {
    if locality.is_empty() {
        return None;
    }
    let [region, zone, sub_zone] = parts(locality).map(str::to_string);
    Some(envoy_types::pb::envoy::config::core::v3::Locality {
        region,
        zone,
        sub_zone,
    })
}

/// The failover priority of each member for a proxy at `locality` with `labels` (before
/// numbering without gaps).
fn raw_priority(
    plan: &Plan,
    m: &Member,
    locality: &str,
    labels: &BTreeMap<String, String>,
    cluster_id: &str,
) -> u32 {
    let s = plan.setting;
    let by_labels = !s.failover_priority.is_empty() && !labels.is_empty();
    let mut label_tier = 0u32;
    if by_labels {
        let theirs = crate::model::endpoint_labels(m.endpoint, cluster_id);
        let n = u32::try_from(s.failover_priority.len()).unwrap_or(u32::MAX);
        let mut adjust = 0;
        for (j, l) in s.failover_priority.iter().enumerate() {
            let (name, want) = match l.split_once('=') {
                Some((name, value)) => (name, value),
                None => (
                    l.as_str(),
                    labels.get(l).map(String::as_str).unwrap_or_default(),
                ),
            };
            if theirs.get(name).map(String::as_str).unwrap_or_default() != want {
                if j == 0 && name == "topology.istio.io/network" {
                    adjust = n;
                    continue;
                }
                label_tier = n - u32::try_from(j).unwrap_or(0);
                break;
            }
        }
        label_tier += adjust;
    }
    if by_labels && s.failover.is_empty() {
        return label_tier;
    }
    let [pr, pz, ps] = parts(locality);
    let [er, ez, es] = parts(&m.endpoint.locality);
    let mut tier = match (pr == er, pz == ez, ps == es) {
        (true, true, true) => 0,
        (true, true, false) => 1,
        (true, false, _) => 2,
        (false, _, _) => 3,
    };
    if tier == 3
        && let Some(f) = s.failover.iter().find(|f| f.from == pr)
        && er != f.to
    {
        tier = 4;
    }
    label_tier * 5 + tier
}

/// The assignment of a planned cluster for a proxy at `locality` with `labels`.
pub fn assignment(
    plan: &Plan,
    cluster: &str,
    members: Vec<Member>,
    locality: &str,
    labels: &BTreeMap<String, String>,
    cluster_id: &str,
) -> ClusterLoadAssignment {
    let distribute = plan
        .setting
        .distribute
        .iter()
        .find(|d| matches(locality, &d.from));
    let mut endpoints = if !plan.setting.distribute.is_empty() || !plan.failover {
        group(members.into_iter().map(|m| (m, 0)))
    } else {
        let ranked: Vec<(Member, u32)> = members
            .into_iter()
            .map(|m| {
                let p = raw_priority(plan, &m, locality, labels, cluster_id);
                (m, p)
            })
            .collect();
        // Numbered from 0 without gaps, in order.
        let order: BTreeSet<u32> = ranked.iter().map(|(_, p)| *p).collect();
        let index: BTreeMap<u32, u32> = order.into_iter().zip(0u32..).collect();
        group(ranked.into_iter().map(|(m, p)| (m, index[&p])))
    };
    if let Some(d) = distribute {
        let mut unmatched: BTreeSet<usize> = (0..endpoints.len()).collect();
        for (to, percent) in &d.to {
            let hit: Vec<usize> = unmatched
                .iter()
                .copied()
                .filter(|i| matches(&label_of(&endpoints[*i]), to))
                .collect();
            let weight = |i: usize| {
                endpoints[i]
                    .load_balancing_weight
                    .as_ref()
                    .map_or(1, |w| w.value)
            };
            let total: u64 = hit.iter().map(|i| u64::from(weight(*i))).sum();
            let shares: Vec<(usize, u32)> = hit
                .iter()
                .map(|i| {
                    let share =
                        (u64::from(weight(*i)) * u64::from(*percent)).div_ceil(total.max(1));
                    (*i, u32::try_from(share).unwrap_or(u32::MAX))
                })
                .collect();
            for (i, share) in shares {
                unmatched.remove(&i);
                if share > 0 {
                    endpoints[i].load_balancing_weight = Some(UInt32Value { value: share });
                }
            }
        }
        for i in unmatched {
            endpoints[i].lb_endpoints.clear();
        }
    }
    if endpoints.is_empty() {
        endpoints.push(LocalityLbEndpoints::default());
    }
    ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints,
        ..Default::default()
    }
}

/// A group's locality as `region/zone/subzone`.
fn label_of(l: &LocalityLbEndpoints) -> String {
    l.locality
        .as_ref()
        .map(|l| format!("{}/{}/{}", l.region, l.zone, l.sub_zone))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use prost::Message;

    use super::*;
    use crate::push_context::from_yaml;

    const CLUSTER: &str = "outbound|5000||helloworld.sample.svc.cluster.local";

    /// helloworld in the four localities of Istio's tasks (one endpoint each, r1z1 two), and
    /// `rule`.
    fn push(rule: &str) -> PushContext {
        let mut yaml = String::from(
            "kind: ServiceEntry\nmetadata: {name: helloworld, namespace: sample}\nspec:\n  hosts: [helloworld.sample.svc.cluster.local]\n  addresses: [10.96.0.50]\n  ports: [{number: 5000, name: http, protocol: HTTP}]\n  workloadSelector: {labels: {app: helloworld}}\n",
        );
        for (i, (loc, version)) in [
            ("region1/zone1", "a"),
            ("region1/zone1", "b"),
            ("region1/zone2", "a"),
            ("region2/zone3", "a"),
            ("region3/zone4", "a"),
        ]
        .iter()
        .enumerate()
        {
            yaml.push_str(&format!(
                "---\nkind: WorkloadEntry\nmetadata: {{name: hw-{i}, namespace: sample}}\nspec: {{address: 10.0.0.{}, labels: {{app: helloworld, version: {version}}}, locality: {loc}}}\n",
                i + 1
            ));
        }
        if !rule.is_empty() {
            yaml.push_str("---\n");
            yaml.push_str(rule);
        }
        let mut push = from_yaml(&yaml);
        push.cache = crate::push_context::GenCache::checked();
        push
    }

    /// The curl client of the tasks, in region1/zone1 (as its node says), version `a`.
    fn client() -> Proxy {
        let mut p =
            Proxy::from_node_id("sidecar~10.0.1.1~client.sample~sample.svc.cluster.local").unwrap();
        p.labels = [("app", "curl"), ("version", "a")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        p.locality = "region1/zone1".into();
        p
    }

    /// (locality, priority, weight, endpoints) of each group the client is sent.
    fn groups(push: &PushContext, proxy: &Proxy) -> Vec<(String, u32, u32, usize)> {
        let named = super::super::eds::generate(push, proxy, &[CLUSTER]);
        let cla = ClusterLoadAssignment::decode(named[0].resource.value.as_slice()).unwrap();
        cla.endpoints
            .iter()
            .map(|g| {
                (
                    label_of(g),
                    g.priority,
                    g.load_balancing_weight.as_ref().map_or(0, |w| w.value),
                    g.lb_endpoints.len(),
                )
            })
            .collect()
    }

    fn weighted(push: &PushContext) -> bool {
        super::super::cds::generate(push, &client())
            .iter()
            .filter_map(|n| Cluster::decode(n.resource.value.as_slice()).ok())
            .find(|c| c.name == CLUSTER)
            .and_then(|c| c.common_lb_config)
            .is_some_and(|l| l.locality_config_specifier.is_some())
    }

    fn rule(policy: &str) -> String {
        format!(
            "kind: DestinationRule\nmetadata: {{name: helloworld, namespace: sample}}\nspec:\n  host: helloworld.sample.svc.cluster.local\n  trafficPolicy:\n{policy}"
        )
    }

    const OUTLIERS: &str =
        "    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 1m}\n";

    /// Without outlier detection every locality is at priority 0 and no cluster flag is set;
    /// every endpoint and group carries istiod's weight (1 each, the sum per group).
    #[test]
    fn without_outlier_detection_nothing_changes() {
        let p = push("");
        assert_eq!(
            groups(&p, &client()),
            [
                ("region1/zone1/".to_string(), 0, 2, 2),
                ("region1/zone2/".to_string(), 0, 1, 1),
                ("region2/zone3/".to_string(), 0, 1, 1),
                ("region3/zone4/".to_string(), 0, 1, 1),
            ]
        );
        assert!(!weighted(&p));
    }

    /// Istio's locality failover task: outlier detection turns on failover by region, zone and
    /// subzone (the mesh default), the `failover` list puts region2 before region3, and the
    /// priorities are numbered without gaps (0, 1, 2, 3 where the task's table says 0, 2, 3, 4).
    #[test]
    fn the_failover_task_ranks_localities() {
        let failover = push(&rule(&format!(
            "    loadBalancer:\n      simple: ROUND_ROBIN\n      localityLbSetting:\n        enabled: true\n        failover: [{{from: region1, to: region2}}]\n{OUTLIERS}"
        )));
        assert_eq!(
            groups(&failover, &client()),
            [
                ("region1/zone1/".to_string(), 0, 2, 2),
                ("region1/zone2/".to_string(), 1, 1, 1),
                ("region2/zone3/".to_string(), 2, 1, 1),
                ("region3/zone4/".to_string(), 3, 1, 1),
            ]
        );
        assert!(
            weighted(&failover),
            "a failover list sets locality_weighted_lb_config"
        );
        // Outlier detection alone: region2 and region3 are both "another region".
        let default = push(&rule(OUTLIERS));
        let priorities: Vec<u32> = groups(&default, &client()).iter().map(|g| g.1).collect();
        assert_eq!(priorities, [0, 1, 2, 2]);
        assert!(!weighted(&default));
        // A proxy elsewhere is ranked from where it is.
        let mut far =
            Proxy::from_node_id("sidecar~10.9.9.9~far.sample~sample.svc.cluster.local").unwrap();
        far.locality = "region3/zone4".into();
        let priorities: Vec<u32> = groups(&default, &far).iter().map(|g| g.1).collect();
        assert_eq!(priorities, [1, 1, 1, 0]);
        // enabled: false turns it off.
        let off = push(&rule(&format!(
            "    loadBalancer: {{localityLbSetting: {{enabled: false}}}}\n{OUTLIERS}"
        )));
        assert!(groups(&off, &client()).iter().all(|g| g.1 == 0));
    }

    /// Istio's weighted distribution task: 70/20/10 from region1/zone1, region2 kept with no
    /// endpoint; a proxy no `from` matches gets the plain assignment.
    #[test]
    fn the_distribute_task_weights_localities() {
        let p = push(&rule(
            "    loadBalancer:\n      localityLbSetting:\n        enabled: true\n        distribute:\n        - from: region1/zone1/*\n          to: {\"region1/zone1/*\": 70, \"region1/zone2/*\": 20, \"region3/zone4/*\": 10}\n    outlierDetection: {consecutive5xxErrors: 100, interval: 1s, baseEjectionTime: 1m}\n",
        ));
        assert_eq!(
            groups(&p, &client()),
            [
                ("region1/zone1/".to_string(), 0, 70, 2),
                ("region1/zone2/".to_string(), 0, 20, 1),
                ("region2/zone3/".to_string(), 0, 1, 0),
                ("region3/zone4/".to_string(), 0, 10, 1),
            ]
        );
        assert!(weighted(&p));
        let mut other = client();
        other.locality = "region2/zone3".into();
        let weights: Vec<u32> = groups(&p, &other).iter().map(|g| g.2).collect();
        assert_eq!(weights, [2, 1, 1, 1]);
    }

    /// `failoverPriority`: endpoints matching the proxy's labels in order first; `label=value`
    /// compares with the value; with a `failover` list too, locality orders within a label tier.
    #[test]
    fn failover_priority_ranks_by_labels() {
        let by_version = push(&rule(&format!(
            "    loadBalancer: {{localityLbSetting: {{failoverPriority: [version]}}}}\n{OUTLIERS}"
        )));
        // The client is version a: every `a` endpoint first, the `b` one after, whatever its
        // locality (each locality's group split by priority).
        assert_eq!(
            groups(&by_version, &client()),
            [
                ("region1/zone1/".to_string(), 0, 1, 1),
                ("region1/zone1/".to_string(), 1, 1, 1),
                ("region1/zone2/".to_string(), 0, 1, 1),
                ("region2/zone3/".to_string(), 0, 1, 1),
                ("region3/zone4/".to_string(), 0, 1, 1),
            ]
        );
        let to_b = push(&rule(&format!(
            "    loadBalancer: {{localityLbSetting: {{failoverPriority: [version=b], failover: [{{from: region1, to: region3}}]}}}}\n{OUTLIERS}"
        )));
        // b (in region1/zone1) first; then the rest by locality: region1/zone1's `a`, zone2,
        // region3 (the failover target), region2.
        assert_eq!(
            groups(&to_b, &client())
                .iter()
                .map(|g| (g.0.as_str(), g.1))
                .collect::<Vec<_>>(),
            [
                ("region1/zone1/", 0),
                ("region1/zone1/", 1),
                ("region1/zone2/", 2),
                ("region2/zone3/", 4),
                ("region3/zone4/", 3),
            ]
        );
    }

    /// A mesh-wide `distribute` applies to every service without a DestinationRule.
    #[test]
    fn the_mesh_setting_applies_without_a_rule() {
        let p = push(
            "kind: MeshConfig\nmetadata: {name: mesh}\nspec:\n  localityLbSetting:\n    distribute:\n    - from: \"*\"\n      to: {region1: 100}\n",
        );
        let weights: Vec<(u32, usize)> = groups(&p, &client()).iter().map(|g| (g.2, g.3)).collect();
        assert_eq!(weights, [(67, 2), (34, 1), (1, 0), (1, 0)]);
        assert!(weighted(&p));
    }
}
