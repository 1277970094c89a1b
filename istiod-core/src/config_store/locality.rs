//! `localityLbSetting` (istio/api `networking/v1alpha3/destination_rule.proto`
//! LocalityLoadBalancerSetting), in a DestinationRule's `loadBalancer` and in MeshConfig, checked
//! as Istio's `pkg/config/validation/agent` checks it (`validateLocalityLbSetting`), each error
//! naming the field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where traffic goes by locality: `distribute` weights, or `failover` (region to region) and
/// `failoverPriority` (labels) when endpoints fail outlier detection. `enabled: false` turns
/// it off.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalityLbSetting {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub distribute: Vec<Distribute>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failover: Vec<Failover>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failover_priority: Vec<String>,
}

/// Traffic from proxies in `from` split over `to` localities by percentage.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Distribute {
    pub from: String,
    pub to: BTreeMap<String, u32>,
}

/// When `from`'s endpoints fail, traffic goes to region `to` before any other.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Failover {
    pub from: String,
    pub to: String,
}

/// Istio's mesh default: locality load balancing on, with no lists (failover by region, zone
/// and subzone wherever a DestinationRule sets outlier detection).
pub static MESH_DEFAULT: LocalityLbSetting = LocalityLbSetting {
    enabled: Some(true),
    distribute: Vec::new(),
    failover: Vec::new(),
    failover_priority: Vec::new(),
};

/// The topology labels `failover` already orders by: `failoverPriority` may not name them
/// beside a `failover` list.
const TOPOLOGY_LABELS: [&str; 3] = [
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.istio.io/subzone",
];

impl LocalityLbSetting {
    /// Istio's checks; `field` names the setting (`trafficPolicy.loadBalancer.localityLbSetting`).
    pub fn check(&self, field: &str) -> Result<(), String> {
        if !self.distribute.is_empty() && !self.failover.is_empty() {
            return Err(format!(
                "{field}: distribute and failover cannot be set together"
            ));
        }
        if !self.failover.is_empty()
            && let Some(l) = self
                .failover_priority
                .iter()
                .find(|l| TOPOLOGY_LABELS.contains(&l.as_str()))
        {
            return Err(format!(
                "{field}.failoverPriority: {l:?} cannot be set together with failover (failover orders by region, zone and subzone already)"
            ));
        }
        for (i, d) in self.distribute.iter().enumerate() {
            let at = format!("{field}.distribute[{i}]");
            let mut total = 0u64;
            for (loc, w) in &d.to {
                if !(1..=100).contains(w) {
                    return Err(format!("{at}.to[{loc:?}]: weight {w} is not in 1..100"));
                }
                total += u64::from(*w);
            }
            if total != 100 {
                return Err(format!("{at}.to: the weights add up to {total}, not 100"));
            }
            check_localities(&format!("{at}.to"), d.to.keys().map(String::as_str))?;
        }
        check_localities(
            &format!("{field}.distribute[].from"),
            self.distribute.iter().map(|d| d.from.as_str()),
        )?;
        for (i, f) in self.failover.iter().enumerate() {
            let at = format!("{field}.failover[{i}]");
            for (name, v) in [("from", &f.from), ("to", &f.to)] {
                if v.is_empty() || v.contains('/') || v.contains('*') {
                    return Err(format!(
                        "{at}.{name}: {v:?} is not a region (failover names regions, without '/' or '*')"
                    ));
                }
            }
            if f.from == f.to {
                return Err(format!(
                    "{at}: from and to are the same region {:?}",
                    f.from
                ));
            }
        }
        Ok(())
    }

    /// Whether `failover` or `failoverPriority` asks for anything (what needs outlier detection).
    pub fn fails_over(&self) -> bool {
        !self.failover.is_empty() || !self.failover_priority.is_empty()
    }
}

/// Istio's `validateLocalities`: each a `region[/zone[/subzone]]` with at most one `*`, last;
/// no empty part; none covering another (`*` before anything, `r` and `r/z`, `r/*` and `r/z`).
fn check_localities<'a>(field: &str, all: impl Iterator<Item = &'a str>) -> Result<(), String> {
    let all: Vec<&str> = all.collect();
    for l in &all {
        if l.is_empty() {
            return Err(format!("{field}: an empty locality"));
        }
        let parts: Vec<&str> = l.split('/').collect();
        if parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
            return Err(format!("{field}: {l:?} is not region[/zone[/subzone]]"));
        }
        if let Some(i) = parts.iter().position(|p| p.contains('*'))
            && (parts[i] != "*" || i != parts.len() - 1)
        {
            return Err(format!("{field}: {l:?}: '*' may only be a whole last part"));
        }
    }
    for (i, a) in all.iter().enumerate() {
        for b in all.iter().skip(i + 1) {
            if covers(a, b) || covers(b, a) {
                return Err(format!("{field}: {a:?} and {b:?} overlap"));
            }
        }
    }
    Ok(())
}

/// Whether locality pattern `a` takes in everything `b` names.
fn covers(a: &str, b: &str) -> bool {
    let a = a.strip_suffix("/*").unwrap_or(a);
    let b = b.strip_suffix("/*").unwrap_or(b);
    a == "*" || b == a || b.starts_with(&format!("{a}/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(yaml: &str) -> LocalityLbSetting {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    fn error(yaml: &str) -> String {
        setting(yaml).check("lb").unwrap_err()
    }

    #[test]
    fn the_istio_tasks_settings_are_valid() {
        for ok in [
            "enabled: true\nfailover: [{from: region1, to: region2}]",
            "distribute:\n- from: region1/zone1/*\n  to: {region1/zone1/*: 70, region1/zone2/*: 20, region3/zone4/*: 10}",
            "failoverPriority: [topology.istio.io/network, topology.kubernetes.io/region]",
            "failover: [{from: r1, to: r2}]\nfailoverPriority: [version]",
            "enabled: false",
        ] {
            assert_eq!(setting(ok).check("lb"), Ok(()), "{ok}");
        }
    }

    #[test]
    fn what_istio_refuses_is_refused_naming_the_field() {
        assert!(
            error("distribute: [{from: r1, to: {r1: 100}}]\nfailover: [{from: r1, to: r2}]")
                .contains("distribute and failover")
        );
        assert!(
            error(
                "failover: [{from: r1, to: r2}]\nfailoverPriority: [topology.kubernetes.io/zone]"
            )
            .starts_with("lb.failoverPriority: \"topology.kubernetes.io/zone\"")
        );
        assert_eq!(
            error("distribute: [{from: r1, to: {r1: 60, r2: 30}}]"),
            "lb.distribute[0].to: the weights add up to 90, not 100"
        );
        assert!(error("distribute: [{from: r1, to: {r1: 0, r2: 100}}]").contains("not in 1..100"));
        assert!(error("distribute: [{from: r1, to: {r1: 50, r1/z1: 50}}]").contains("overlap"));
        assert!(error("distribute: [{from: r1, to: {'*': 50, r2: 50}}]").contains("overlap"));
        assert!(error("distribute: [{from: r1, to: {r1/*/z: 100}}]").contains("'*'"));
        assert!(error("distribute: [{from: r1, to: {r1//z: 100}}]").contains("region[/zone"));
        assert!(
            error("distribute: [{from: r1, to: {r1: 100}}, {from: r1/z1, to: {r1: 100}}]")
                .contains("lb.distribute[].from")
        );
        assert!(error("failover: [{from: r1/z1, to: r2}]").contains("failover[0].from"));
        assert!(error("failover: [{from: r1, to: r1}]").contains("same region"));
        assert!(
            serde_yaml_ng::from_str::<LocalityLbSetting>("failovr: []").is_err(),
            "unknown field"
        );
    }
}
