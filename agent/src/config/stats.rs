//! Which of Envoy's statistics exist, and how they are tagged: Istio's `stats_config` inputs.
//! Envoy creates only the stats its inclusion list matches, so this decides what 15090 serves
//! and much of Envoy's memory. Istio's semantics (pkg/bootstrap/config.go `getStatsOptions`):
//! - each of the three lists (prefixes, suffixes, regexps) is the pod annotation
//!   `sidecar.istio.io/statsInclusion{Prefixes,Suffixes,Regexps}` when that is non-empty, else
//!   ProxyConfig `proxyStatsMatcher`'s list, followed by the entries Istio always adds (the
//!   agent's readiness and drain read them);
//! - `{pod_ip}` in an entry becomes one entry per instance IP;
//! - extra stat tags: ProxyConfig `extraStatTags` then the `sidecar.istio.io/extraStatTags`
//!   annotation, first occurrence kept;
//! - histogram buckets, flush and eviction intervals: annotations only.
//!
//! Where we differ: an empty list element (`a,,b`) is dropped with a warning where Istio writes a
//! prefix `""` that matches every stat; a regexp must be RE2 (what Envoy compiles) or the agent
//! refuses to start, naming it, where Istio hands it to Envoy, which then refuses the bootstrap;
//! intervals are written as protobuf durations (Istio writes Go's `1m0s`, which Envoy rejects).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, err};

/// Prefixes Istio always includes (`requiredEnvoyStatsMatcherInclusionPrefixes`).
pub const REQUIRED_PREFIXES: [&str; 5] = [
    "cluster_manager",
    "listener_manager",
    "server",
    "cluster.xds-grpc",
    "wasm",
];
/// Suffixes Istio always includes (`requiredEnvoyStatsMatcherInclusionSuffixes`).
pub const REQUIRED_SUFFIXES: [&str; 4] = [
    "rbac.allowed",
    "rbac.denied",
    "shadow_allowed",
    "shadow_denied",
];
/// With EXIT_ON_ZERO_ACTIVE_CONNECTIONS the drain counts these.
pub const EXIT_ON_ZERO_SUFFIX: &str = "downstream_cx_active";
/// The regexp Istio always includes (per-route stats).
pub const REQUIRED_REGEXPS: [&str; 1] = [r"vhost\..*\.route\..*"];

pub const PREFIXES_ANNOTATION: &str = "sidecar.istio.io/statsInclusionPrefixes";
pub const SUFFIXES_ANNOTATION: &str = "sidecar.istio.io/statsInclusionSuffixes";
pub const REGEXPS_ANNOTATION: &str = "sidecar.istio.io/statsInclusionRegexps";
pub const EXTRA_TAGS_ANNOTATION: &str = "sidecar.istio.io/extraStatTags";
pub const BUCKETS_ANNOTATION: &str = "sidecar.istio.io/statsHistogramBuckets";
pub const FLUSH_ANNOTATION: &str = "sidecar.istio.io/statsFlushInterval";
pub const EVICTION_ANNOTATION: &str = "sidecar.istio.io/statsEvictionInterval";

/// Envoy's default flush interval, against which an eviction interval must be a multiple.
const DEFAULT_FLUSH: Duration = Duration::from_secs(5);

/// ProxyConfig `proxyStatsMatcher` (istio/api mesh/v1alpha1/proxy.proto).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyStatsMatcher {
    pub inclusion_prefixes: Option<Vec<String>>,
    pub inclusion_suffixes: Option<Vec<String>>,
    pub inclusion_regexps: Option<Vec<String>>,
}

/// What the bootstrap's `stats_config` and stats intervals are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsConfig {
    pub prefixes: Vec<String>,
    pub suffixes: Vec<String>,
    pub regexps: Vec<String>,
    pub extra_tags: Vec<String>,
    /// (prefix, bucket bounds), sorted by prefix.
    pub histogram_buckets: Vec<(String, Vec<f64>)>,
    pub flush_interval: Option<Duration>,
    pub eviction_interval: Option<Duration>,
}

/// The inputs: ProxyConfig's two fields, the pod's annotations and the rest of the pod's facts.
pub struct StatsInputs<'a> {
    pub matcher: Option<&'a ProxyStatsMatcher>,
    pub extra_stat_tags: Option<&'a [String]>,
    pub annotations: &'a BTreeMap<String, String>,
    pub instance_ips: &'a [IpAddr],
    pub exit_on_zero_active_connections: bool,
}

impl StatsConfig {
    pub fn from_inputs(i: &StatsInputs) -> Result<StatsConfig, ConfigError> {
        let m = i.matcher.cloned().unwrap_or_default();
        let mut suffixes_required: Vec<&str> = REQUIRED_SUFFIXES.to_vec();
        if i.exit_on_zero_active_connections {
            suffixes_required.push(EXIT_ON_ZERO_SUFFIX);
        }
        // A list's annotation wins when it is set and not empty.
        let annotated = |annotation: &str| i.annotations.get(annotation).filter(|a| !a.is_empty());
        let list = |annotation: &str, from_pc: Option<Vec<String>>, required: &[&str]| {
            let user = match annotated(annotation) {
                Some(a) => split(annotation, a),
                None => from_pc.unwrap_or_default(),
            };
            let all = user
                .into_iter()
                .chain(required.iter().map(|s| s.to_string()));
            substitute_pod_ip(all, i.instance_ips)
        };
        let prefixes = list(
            PREFIXES_ANNOTATION,
            m.inclusion_prefixes,
            &REQUIRED_PREFIXES,
        );
        let suffixes = list(
            SUFFIXES_ANNOTATION,
            m.inclusion_suffixes,
            &suffixes_required,
        );
        let regexps = list(REGEXPS_ANNOTATION, m.inclusion_regexps, &REQUIRED_REGEXPS);
        let source = if annotated(REGEXPS_ANNOTATION).is_some() {
            format!("annotation {REGEXPS_ANNOTATION}")
        } else {
            "ProxyConfig proxyStatsMatcher.inclusionRegexps".to_string()
        };
        for re in &regexps {
            mesh_common::re2::check_regex(&source, re)
                .map_err(|why| err(&source, re, &format!("an RE2 regular expression ({why})")))?;
        }
        let mut extra_tags: Vec<String> = Vec::new();
        let from_annotation = i
            .annotations
            .get(EXTRA_TAGS_ANNOTATION)
            .map(|a| split(EXTRA_TAGS_ANNOTATION, a))
            .unwrap_or_default();
        for tag in i
            .extra_stat_tags
            .unwrap_or_default()
            .iter()
            .filter(|t| !t.is_empty())
            .cloned()
            .chain(from_annotation)
        {
            if !extra_tags.contains(&tag) {
                extra_tags.push(tag);
            }
        }
        let flush_interval = annotation_duration(i.annotations, FLUSH_ANNOTATION);
        let eviction_interval = annotation_duration(i.annotations, EVICTION_ANNOTATION)
            .filter(|e| {
                let flush = flush_interval.unwrap_or(DEFAULT_FLUSH);
                // Both are at least 1ms (`annotation_duration`).
                let multiple = e.as_nanos() % flush.as_nanos() == 0;
                if !multiple {
                    tracing::warn!(
                        annotation = EVICTION_ANNOTATION,
                        eviction = ?e,
                        flush = ?flush,
                        "the stats eviction interval must be a multiple of the flush interval; not set"
                    );
                }
                multiple
            });
        Ok(StatsConfig {
            prefixes,
            suffixes,
            regexps,
            extra_tags,
            histogram_buckets: histogram_buckets(i.annotations),
            flush_interval,
            eviction_interval,
        })
    }
}

/// An annotation's comma-separated list as Istio splits it (no trimming); empty elements are
/// dropped with a warning (Istio would write them as a match-everything entry).
fn split(annotation: &str, value: &str) -> Vec<String> {
    let parts: Vec<String> = value.split(',').map(str::to_string).collect();
    if parts.iter().any(String::is_empty) {
        tracing::warn!(
            annotation,
            value,
            "empty element in the list dropped (Istio would include every stat for it)"
        );
    }
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// `{pod_ip}` in an entry: one entry per instance IP, in order.
fn substitute_pod_ip(entries: impl Iterator<Item = String>, ips: &[IpAddr]) -> Vec<String> {
    entries
        .flat_map(|e| {
            if e.contains("{pod_ip}") {
                ips.iter()
                    .map(|ip| e.replace("{pod_ip}", &ip.to_string()))
                    .collect()
            } else {
                vec![e]
            }
        })
        .collect()
}

/// A Go duration from an annotation; a bad one is warned about and left unset (as Istio).
fn annotation_duration(annotations: &BTreeMap<String, String>, name: &str) -> Option<Duration> {
    let raw = annotations.get(name)?;
    match mesh_common::duration::parse_go_duration(raw) {
        Ok(d) if d >= Duration::from_millis(1) && d <= Duration::from_secs(300) => Some(d),
        Ok(d) => {
            tracing::warn!(annotation = name, value = %raw, parsed = ?d, "outside Envoy's 1ms..5m; not set");
            None
        }
        Err(e) => {
            tracing::warn!(annotation = name, value = %raw, error = %e, "not a duration; not set");
            None
        }
    }
}

/// `{"prefix": [bounds...]}`, sorted by prefix; bad JSON is warned about and ignored (as Istio).
fn histogram_buckets(annotations: &BTreeMap<String, String>) -> Vec<(String, Vec<f64>)> {
    let Some(raw) = annotations.get(BUCKETS_ANNOTATION) else {
        return Vec::new();
    };
    match serde_json::from_str::<BTreeMap<String, Vec<f64>>>(raw) {
        Ok(map) => map.into_iter().collect(),
        Err(e) => {
            tracing::warn!(annotation = BUCKETS_ANNOTATION, value = %raw, error = %e,
                "not a JSON object of prefix to bucket bounds; ignored");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(
        annotations: &[(&str, &str)],
        matcher: Option<ProxyStatsMatcher>,
    ) -> Result<StatsConfig, ConfigError> {
        let annotations: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let ips: Vec<IpAddr> = vec!["10.1.1.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        StatsConfig::from_inputs(&StatsInputs {
            matcher: matcher.as_ref(),
            extra_stat_tags: Some(&["a".to_string(), String::new()]),
            annotations: &annotations,
            instance_ips: &ips,
            exit_on_zero_active_connections: false,
        })
    }

    #[test]
    fn istios_defaults_and_the_annotation_winning_per_list() {
        let c = config(&[], None).unwrap();
        assert_eq!(c.prefixes, REQUIRED_PREFIXES);
        assert_eq!(c.suffixes, REQUIRED_SUFFIXES);
        assert_eq!(c.regexps, REQUIRED_REGEXPS);
        assert_eq!(c.extra_tags, ["a"]);
        let pc = ProxyStatsMatcher {
            inclusion_prefixes: Some(vec!["from_pc".into()]),
            inclusion_suffixes: Some(vec!["sfx".into()]),
            inclusion_regexps: None,
        };
        let c = config(
            &[
                (PREFIXES_ANNOTATION, "http.{pod_ip}_,x,,y"),
                (EXTRA_TAGS_ANNOTATION, "b,a"),
            ],
            Some(pc),
        )
        .unwrap();
        assert_eq!(
            c.prefixes[..4],
            ["http.10.1.1.1_", "http.fd00::1_", "x", "y"]
        );
        assert_eq!(c.suffixes[0], "sfx");
        assert_eq!(c.extra_tags, ["a", "b"]);
    }

    #[test]
    fn a_regexp_envoy_cannot_compile_is_refused_by_name() {
        let e = config(&[(REGEXPS_ANNOTATION, "(a")], None).unwrap_err();
        assert_eq!(e.input, format!("annotation {REGEXPS_ANNOTATION}"));
    }

    #[test]
    fn intervals_and_buckets_as_istio_reads_them() {
        let c = config(
            &[
                (FLUSH_ANNOTATION, "10s"),
                (EVICTION_ANNOTATION, "30s"),
                (BUCKETS_ANNOTATION, r#"{"istio":[1,5],"envoy":[0.5]}"#),
            ],
            None,
        )
        .unwrap();
        assert_eq!(c.flush_interval, Some(Duration::from_secs(10)));
        assert_eq!(c.eviction_interval, Some(Duration::from_secs(30)));
        assert_eq!(
            c.histogram_buckets,
            [
                ("envoy".into(), vec![0.5]),
                ("istio".into(), vec![1.0, 5.0])
            ]
        );
        let c = config(
            &[
                (EVICTION_ANNOTATION, "11s"),
                (BUCKETS_ANNOTATION, "not json"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(c.eviction_interval, None);
        assert!(c.histogram_buckets.is_empty());
    }
}
