//! The Telemetry resources that apply to a proxy and what they add up to, side by side (client:
//! outbound listeners and gateways; server: inbound), as istiod's `pilot/pkg/model/telemetry.go`
//! merges them: the root namespace's selector-less Telemetry, then the proxy's namespace's,
//! then those of its namespace whose selector matches it; later entries override earlier
//! ones. Where nothing configures access logging or tracing, the mesh config's legacy
//! switches apply (`accessLogFile`, `enableTracing`). Generators turn the result into Envoy
//! config (`generators::telemetry`).

use std::collections::BTreeMap;

use crate::config_store::Metadata;
use crate::config_store::providers::DefaultProviders;
use crate::config_store::telemetry::{
    AccessLogging, CustomTag, IstioMetric, Metrics, TagOperation, TelemetrySpec, Tracing,
};
use crate::config_store::values::Percentage;
use mesh_common::telemetry::{MetricConfig, MetricsPlan};

/// A proxy's telemetry, one side of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Side {
    /// The access-log providers; `None`: no Telemetry or default provider configures access
    /// logging, so the mesh config's `accessLogFile` rules.
    pub access_logs: Option<AccessLogPlan>,
    /// Tracing; `None`: nothing configures it, so the legacy bootstrap tracer is used when
    /// `enableTracing` (Istio's default) is on.
    pub tracing: Option<TracingPlan>,
    /// Istio's standard metrics; `None`: off for this side.
    pub metrics: Option<MetricsPlan>,
}

/// Access logging as the Telemetries merge it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessLogPlan {
    /// The providers on, by name, each with its CEL filter.
    pub on: Vec<(String, Option<String>)>,
    /// The providers turned off (they count as configured: no fallback to `accessLogFile`).
    pub disabled: Vec<String>,
}

/// Tracing as the Telemetries merge it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TracingPlan {
    /// The provider (Istio uses the first named); `None`: tracing off.
    pub provider: Option<String>,
    /// `randomSamplingPercentage`; `None`: ProxyConfig's sampling (Istio's default 1%).
    pub sampling: Option<Percentage>,
    pub custom_tags: BTreeMap<String, CustomTag>,
    pub disable_span_reporting: bool,
    pub use_request_id_for_trace_sampling: Option<bool>,
}

/// Both sides of a proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyTelemetry {
    pub client: Side,
    pub server: Side,
}

impl ProxyTelemetry {
    pub fn side(&self, client: bool) -> &Side {
        if client { &self.client } else { &self.server }
    }
}

/// The Telemetries that apply to a workload in `namespace` with `labels`, in merge order:
/// the root namespace's selector-less one, the namespace's selector-less one, then those of
/// the namespace whose selector matches (Istio: oldest first; here by name, as the snapshot
/// keeps them). One Telemetry bound by targetRefs applies to no sidecar.
pub fn applicable<'a>(
    telemetries: &'a [(Metadata, TelemetrySpec)],
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a TelemetrySpec> {
    let wide = |ns: &str| {
        telemetries
            .iter()
            .find(|(m, s)| m.namespace() == ns && s.selector.is_none() && !s.targeted())
            .map(|(_, s)| s)
    };
    let mut out: Vec<&TelemetrySpec> = wide(root_namespace).into_iter().collect();
    if namespace != root_namespace {
        out.extend(wide(namespace));
    }
    out.extend(
        telemetries
            .iter()
            .filter(|(m, s)| {
                m.namespace() == namespace
                    && s.selector
                        .as_ref()
                        .is_some_and(|sel| crate::registry::selects(&sel.match_labels, labels))
            })
            .map(|(_, s)| s),
    );
    out
}

/// Both sides' telemetry from the applicable Telemetries (in order) and the defaults.
pub fn merge(specs: &[&TelemetrySpec], defaults: Option<&DefaultProviders>) -> ProxyTelemetry {
    let logs: Vec<&[AccessLogging]> = specs.iter().map(|s| s.access_logging.as_slice()).collect();
    let traces: Vec<&Tracing> = specs.iter().flat_map(|s| &s.tracing).collect();
    let metrics: Vec<&Metrics> = specs.iter().flat_map(|s| &s.metrics).collect();
    let default = |pick: fn(&DefaultProviders) -> &Option<Vec<String>>| {
        defaults.and_then(|d| pick(d).clone())
    };
    let log_defaults = default(|d| &d.access_logging);
    let trace_defaults = default(|d| &d.tracing);
    // Istio's Helm default: Prometheus, when the mesh config names no metrics providers.
    let metric_defaults = default(|d| &d.metrics).unwrap_or_else(|| vec![PROMETHEUS.to_string()]);
    let side = |client: bool| Side {
        access_logs: access_logs(&logs, log_defaults.as_deref(), client),
        tracing: tracing(&traces, trace_defaults.as_deref(), client),
        metrics: metrics_plan(&metrics, &metric_defaults, client),
    };
    ProxyTelemetry {
        client: side(true),
        server: side(false),
    }
}

/// The built-in metrics provider.
pub const PROMETHEUS: &str = "prometheus";

fn names(providers: &[crate::config_store::telemetry::ProviderRef]) -> Vec<String> {
    providers.iter().map(|p| p.name.clone()).collect()
}

fn covers(m: Option<&crate::config_store::telemetry::ModeSelector>, client: bool) -> bool {
    m.is_none_or(|m| m.mode.covers(client))
}

/// Istio's `mergeLogs`, one side. Pass one, level by level (root, namespace, workload): the
/// providers a level names explicitly (in entries of this side's mode) replace the set in
/// scope, and each such entry's filter is recorded for them. Pass two, entry by entry: the
/// entry's providers (or the previous entry's) that are in scope are turned on with their
/// filter or, `disabled`, off.
fn access_logs(
    levels: &[&[AccessLogging]],
    defaults: Option<&[String]>,
    client: bool,
) -> Option<AccessLogPlan> {
    let defaults = defaults.unwrap_or_default();
    if levels.iter().all(|l| l.is_empty()) {
        if defaults.is_empty() {
            return None;
        }
        return Some(AccessLogPlan {
            on: defaults.iter().map(|d| (d.clone(), None)).collect(),
            disabled: Vec::new(),
        });
    }
    let mut in_scope: Vec<String> = defaults.to_vec();
    let mut filters: BTreeMap<String, String> = BTreeMap::new();
    for level in levels {
        let mut union: Vec<String> = Vec::new();
        for l in level.iter().filter(|l| covers(l.matches.as_ref(), client)) {
            for p in names(&l.providers) {
                if let Some(f) = &l.filter {
                    filters.insert(p.clone(), f.expression.clone());
                }
                if !union.contains(&p) {
                    union.push(p);
                }
            }
        }
        if !union.is_empty() {
            in_scope = union;
        }
    }
    let mut state: BTreeMap<String, Option<Option<String>>> = BTreeMap::new();
    let mut parent: Vec<String> = defaults.to_vec();
    for l in levels.iter().flat_map(|l| l.iter()) {
        let mut providers = names(&l.providers);
        if providers.is_empty() {
            providers.clone_from(&parent);
        }
        parent.clone_from(&providers);
        if !covers(l.matches.as_ref(), client) {
            continue;
        }
        for p in providers.iter().filter(|p| in_scope.contains(p)) {
            let value = (l.disabled != Some(true)).then(|| filters.get(p).cloned());
            state.insert(p.clone(), value);
        }
    }
    let mut plan = AccessLogPlan::default();
    for (name, value) in state {
        match value {
            Some(filter) => plan.on.push((name, filter)),
            None => plan.disabled.push(name),
        }
    }
    Some(plan)
}

/// Tracing: each entry of this side's mode overrides the fields it sets; the provider is the
/// first of the last non-empty list (else the default).
fn tracing(traces: &[&Tracing], defaults: Option<&[String]>, client: bool) -> Option<TracingPlan> {
    let defaults = defaults.unwrap_or_default();
    if traces.is_empty() && defaults.is_empty() {
        return None;
    }
    let mut plan = TracingPlan {
        provider: defaults.first().cloned(),
        ..TracingPlan::default()
    };
    for t in traces.iter().filter(|t| covers(t.matches.as_ref(), client)) {
        if let Some(first) = t.providers.first() {
            plan.provider = Some(first.name.clone());
        }
        if t.random_sampling_percentage.is_some() {
            plan.sampling = t.random_sampling_percentage;
        }
        if let Some(d) = t.disable_span_reporting {
            plan.disable_span_reporting = d;
        }
        if t.use_request_id_for_trace_sampling.is_some() {
            plan.use_request_id_for_trace_sampling = t.use_request_id_for_trace_sampling;
        }
        // The whole map, as Istio replaces it.
        if !t.custom_tags.is_empty() {
            plan.custom_tags.clone_from(&t.custom_tags);
        }
    }
    Some(plan)
}

/// Istio's `mergeMetrics` for the Prometheus provider, one side: `None` when Prometheus is not
/// in scope or every metric is disabled on this side.
fn metrics_plan(metrics: &[&Metrics], defaults: &[String], client: bool) -> Option<MetricsPlan> {
    let mut in_scope: Vec<String> = defaults.to_vec();
    for m in metrics {
        let n = names(&m.providers);
        if !n.is_empty() {
            in_scope = n;
        }
    }
    if !in_scope.iter().any(|p| p.eq_ignore_ascii_case(PROMETHEUS)) {
        return None;
    }
    struct Shape {
        disabled: Option<bool>,
        tags: BTreeMap<String, Option<String>>,
    }
    let mut all_disabled = false;
    let mut interval = None;
    // By the metric's Telemetry API name (Istio's order), with its Prometheus name.
    let mut shapes: BTreeMap<&'static str, (&'static str, Shape)> = BTreeMap::new();
    let mut parent: Vec<String> = defaults.to_vec();
    for m in metrics {
        let mut providers = names(&m.providers);
        if providers.is_empty() {
            providers.clone_from(&parent);
        }
        parent.clone_from(&providers);
        if !providers.iter().any(|p| p.eq_ignore_ascii_case(PROMETHEUS)) {
            continue;
        }
        if let Some(i) = &m.reporting_interval {
            interval = Some(i.value);
        }
        for o in &m.overrides {
            let selector = o.matches.as_ref();
            if !selector.is_none_or(|s| s.mode.covers(client)) {
                continue;
            }
            let metric = selector.and_then(|s| s.metric).unwrap_or_default();
            if metric == IstioMetric::AllMetrics && o.disabled == Some(true) {
                all_disabled = true;
                continue;
            }
            all_disabled = false;
            for (_, api_name, name) in IstioMetric::STANDARD
                .iter()
                .filter(|(m, _, _)| metric == IstioMetric::AllMetrics || *m == metric)
            {
                let (_, shape) = shapes.entry(api_name).or_insert_with(|| {
                    (
                        name,
                        Shape {
                            disabled: None,
                            tags: BTreeMap::new(),
                        },
                    )
                });
                if o.disabled.is_some() {
                    shape.disabled = o.disabled;
                }
                for (tag, over) in &o.tag_overrides {
                    let value = match over.operation {
                        TagOperation::Remove => None,
                        TagOperation::Upsert => Some(over.value.clone()),
                    };
                    shape.tags.insert(tag.clone(), value);
                }
            }
        }
    }
    if all_disabled {
        return None;
    }
    let metrics = shapes
        .into_values()
        .map(|(name, shape)| MetricConfig {
            name: name.to_string(),
            drop: shape.disabled == Some(true),
            tags_to_remove: shape
                .tags
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| k.clone())
                .collect(),
            dimensions: shape
                .tags
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect(),
        })
        .collect();
    Some(MetricsPlan {
        metrics,
        reporting_interval: interval,
    })
}

/// What a Telemetry asks for that is not acted on, each naming the field: providers that do not
/// exist or are of the wrong kind for their section, providers whose service is not in the
/// mesh, a second selector-less Telemetry in a namespace (Istio applies only the oldest; here
/// the first by name), and switches not applied.
pub fn not_applied(
    meta: &Metadata,
    spec: &TelemetrySpec,
    all: &[(Metadata, TelemetrySpec)],
    mesh: &crate::config_store::MeshConfigSpec,
    is_service: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    use crate::config_store::providers::{self, without_namespace};
    let mut out = Vec::new();
    if spec.selector.is_none()
        && !spec.targeted()
        && let Some((first, _)) = all.iter().find(|(m, s)| {
            m.namespace() == meta.namespace() && s.selector.is_none() && !s.targeted()
        })
        && first.name != meta.name
    {
        out.push(format!(
            "spec: {}/{} is the namespace's Telemetry without a selector; only one applies, so this one is ignored",
            first.namespace(),
            first.name
        ));
    }
    let find = |name: &str| providers::find(&mesh.extension_providers, name);
    let builtin = |name: &str, kinds: &[&str]| kinds.iter().any(|k| k.eq_ignore_ascii_case(name));
    let service_of = |p: &providers::ExtensionProvider| {
        p.telemetry_service()
            .map(|(service, _)| without_namespace(service).to_string())
    };
    type Fits<'f> = &'f dyn Fn(&providers::ExtensionProvider) -> bool;
    let check = |at: String, name: &str, section: &str, fits: Fits<'_>, builtins: &[&str]| {
        match find(name) {
            None if builtin(name, builtins) => None,
            None => Some(format!(
                "{at}: no extensionProviders entry is named {name:?}; it is skipped (as in Istio)"
            )),
            Some(p) if !fits(p) => Some(format!(
                "{at}: extension provider {name:?} is a {} provider, not one for {section} here; it is skipped",
                p.kind_name()
            )),
            Some(p) => service_of(p).filter(|h| !is_service(h)).map(|host| {
                format!(
                    "{at}: extension provider {name:?}: {host:?} is no service of the mesh; it is skipped"
                )
            }),
        }
    };
    for (i, l) in spec.access_logging.iter().enumerate() {
        for (j, p) in l.providers.iter().enumerate() {
            out.extend(check(
                format!("spec.accessLogging[{i}].providers[{j}]"),
                &p.name,
                "access logging",
                &|p| {
                    p.envoy_file_access_log.is_some()
                        || p.envoy_otel_als.is_some()
                        || p.envoy_http_als.is_some()
                        || p.envoy_tcp_als.is_some()
                },
                &["envoy"],
            ));
        }
    }
    for (i, t) in spec.tracing.iter().enumerate() {
        for (j, p) in t.providers.iter().enumerate() {
            out.extend(check(
                format!("spec.tracing[{i}].providers[{j}]"),
                &p.name,
                "tracing (zipkin, opentelemetry)",
                &|p| p.zipkin.is_some() || p.opentelemetry.is_some(),
                &[],
            ));
            if j > 0 {
                out.push(format!(
                    "spec.tracing[{i}].providers[{j}]: only the first tracing provider is used (as in Istio)"
                ));
            }
        }
        if t.use_request_id_for_trace_sampling == Some(false) {
            out.push(format!(
                "spec.tracing[{i}].useRequestIdForTraceSampling: false is not applied (Envoy samples by request id)"
            ));
        }
        if t.enable_istio_tags == Some(false) {
            out.push(format!(
                "spec.tracing[{i}].enableIstioTags: false is not applied (Istio's tags stay on every span)"
            ));
        }
    }
    for (i, m) in spec.metrics.iter().enumerate() {
        for (j, p) in m.providers.iter().enumerate() {
            out.extend(check(
                format!("spec.metrics[{i}].providers[{j}]"),
                &p.name,
                "metrics (prometheus)",
                &|p| p.prometheus.is_some(),
                &[PROMETHEUS],
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> TelemetrySpec {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    fn merged(yamls: &[&str]) -> ProxyTelemetry {
        let specs: Vec<TelemetrySpec> = yamls.iter().map(|y| spec(y)).collect();
        let refs: Vec<&TelemetrySpec> = specs.iter().collect();
        merge(&refs, None)
    }

    #[test]
    fn what_is_not_applied_is_named() {
        let mesh: crate::config_store::MeshConfigSpec = serde_yaml_ng::from_str(
            "extensionProviders:\n- {name: zipkin, zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}}\n- {name: otel, envoyOtelAls: {service: gone.example, port: 4317}}",
        )
        .unwrap();
        let meta = |ns: &str, name: &str| Metadata {
            name: name.into(),
            namespace: Some(ns.into()),
            ..Default::default()
        };
        let a = spec(
            "accessLogging: [{providers: [{name: envoy}, {name: zipkin}, {name: otel}, {name: nope}]}]\ntracing: [{providers: [{name: envoy}]}]\nmetrics: [{providers: [{name: prometheus}]}]",
        );
        let all = vec![
            (meta("ns", "a"), a.clone()),
            (meta("ns", "b"), TelemetrySpec::default()),
        ];
        let is_service = |h: &str| h == "zipkin.istio-system.svc.cluster.local";
        let w = not_applied(&all[0].0, &a, &all, &mesh, &is_service);
        let joined = w.join("\n");
        assert!(joined.contains("spec.accessLogging[0].providers[1]: extension provider \"zipkin\" is a zipkin provider"), "{joined}");
        assert!(joined.contains("spec.accessLogging[0].providers[2]: extension provider \"otel\": \"gone.example\" is no service"), "{joined}");
        assert!(
            joined.contains(
                "spec.accessLogging[0].providers[3]: no extensionProviders entry is named \"nope\""
            ),
            "{joined}"
        );
        assert!(joined.contains("spec.tracing[0].providers[0]"), "{joined}");
        assert_eq!(w.len(), 4, "{joined}");
        let w = not_applied(&all[1].0, &all[1].1, &all, &mesh, &is_service);
        assert!(
            w[0].contains("ns/a is the namespace's Telemetry without a selector"),
            "{w:?}"
        );
    }

    #[test]
    fn default_providers_apply_where_no_telemetry_names_one() {
        let defaults: DefaultProviders =
            serde_yaml_ng::from_str("{accessLogging: [envoy], tracing: [zipkin], metrics: []}")
                .unwrap();
        let t = merge(&[], Some(&defaults));
        let logs = t.client.access_logs.unwrap();
        assert_eq!(logs.on, vec![("envoy".to_string(), None)]);
        assert_eq!(
            t.server.tracing.unwrap().provider.as_deref(),
            Some("zipkin")
        );
        // `metrics: []` turns Istio's standard metrics off.
        assert_eq!(t.client.metrics, None);
        // A Telemetry entry without providers acts on the default ones.
        let s = spec(
            "accessLogging: [{match: {mode: CLIENT}, disabled: true}]\ntracing: [{randomSamplingPercentage: 5}]",
        );
        let t = merge(&[&s], Some(&defaults));
        assert_eq!(
            t.client.access_logs.unwrap().disabled,
            vec!["envoy".to_string()]
        );
        // Istio's mergeLogs: no entry of the server's mode, so nothing on for the server (the
        // mesh's accessLogFile then applies), though the default provider was on before.
        assert!(t.server.access_logs.unwrap().on.is_empty());
        let plan = t.client.tracing.unwrap();
        assert_eq!(plan.provider.as_deref(), Some("zipkin"));
        assert_eq!(plan.sampling, Some(Percentage(5.0)));
    }

    #[test]
    fn nothing_configured_leaves_the_legacy_switches_and_prometheus() {
        let t = merged(&[]);
        assert_eq!(t.client.access_logs, None);
        assert_eq!(t.client.tracing, None);
        assert_eq!(t.server.metrics, Some(MetricsPlan::default()));
    }

    #[test]
    fn access_logging_providers_modes_and_disabling() {
        let t = merged(&["accessLogging: [{providers: [{name: envoy}]}]"]);
        let on = |names: &[(&str, Option<&str>)]| AccessLogPlan {
            on: names
                .iter()
                .map(|(n, f)| (n.to_string(), f.map(str::to_string)))
                .collect(),
            disabled: Vec::new(),
        };
        assert_eq!(t.server.access_logs, Some(on(&[("envoy", None)])));
        // A namespace turns the mesh's logger off for its servers only.
        let t = merged(&[
            "accessLogging: [{providers: [{name: envoy}]}]",
            "accessLogging: [{match: {mode: SERVER}, disabled: true}]",
        ]);
        let server = t.server.access_logs.unwrap();
        assert!(server.on.is_empty());
        assert_eq!(server.disabled, vec!["envoy".to_string()]);
        assert_eq!(t.client.access_logs, Some(on(&[("envoy", None)])));
        // A filter applies to the providers the entry names; one on an entry naming none is
        // ignored (as in Istio).
        let t = merged(&[
            "accessLogging: [{providers: [{name: envoy}], filter: {expression: 'response.code >= 400'}}]",
        ]);
        assert_eq!(
            t.client.access_logs,
            Some(on(&[("envoy", Some("response.code >= 400"))]))
        );
        let t = merged(&[
            "accessLogging: [{providers: [{name: envoy}]}]",
            "accessLogging: [{filter: {expression: 'response.code >= 400'}}]",
        ]);
        assert_eq!(t.client.access_logs, Some(on(&[("envoy", None)])));
        // A more specific level's providers replace the set.
        let t = merged(&[
            "accessLogging: [{providers: [{name: envoy}]}]",
            "accessLogging: [{providers: [{name: otel}]}]",
        ]);
        assert_eq!(t.client.access_logs, Some(on(&[("otel", None)])));
    }

    #[test]
    fn tracing_overrides_field_by_field() {
        let t = merged(&[
            "tracing: [{providers: [{name: zipkin}], randomSamplingPercentage: 10, customTags: {a: {literal: {value: x}}}}]",
            "tracing: [{randomSamplingPercentage: 100, customTags: {b: {literal: {value: y}}}}]",
        ]);
        let plan = t.client.tracing.unwrap();
        assert_eq!(plan.provider.as_deref(), Some("zipkin"));
        assert_eq!(plan.sampling, Some(Percentage(100.0)));
        // Custom tags are replaced whole.
        assert_eq!(plan.custom_tags.keys().collect::<Vec<_>>(), vec!["b"]);
        let t = merged(&["tracing: [{match: {mode: SERVER}, disableSpanReporting: true}]"]);
        assert!(t.server.tracing.unwrap().disable_span_reporting);
        assert!(!t.client.tracing.unwrap().disable_span_reporting);
    }

    #[test]
    fn metrics_overrides_as_istio_writes_them() {
        let t = merged(&[
            "metrics: [{providers: [{name: prometheus}], overrides: [{match: {metric: REQUEST_COUNT}, tagOverrides: {remove: {operation: REMOVE}, add: {value: \"'bar'\"}}}]}]",
        ]);
        let m = t.client.metrics.unwrap();
        assert_eq!(m.metrics.len(), 1);
        assert_eq!(m.metrics[0].name, "requests_total");
        assert_eq!(m.metrics[0].tags_to_remove, vec!["remove".to_string()]);
        assert_eq!(m.metrics[0].dimensions["add"], "'bar'");
        // All metrics off on the server side; a later namespace turns them back on.
        let off = "metrics: [{overrides: [{match: {metric: ALL_METRICS, mode: SERVER}, disabled: true}]}]";
        let t = merged(&[off]);
        assert_eq!(t.server.metrics, None);
        assert!(t.client.metrics.is_some());
        let t = merged(&[
            off,
            "metrics: [{overrides: [{match: {metric: REQUEST_COUNT}, disabled: true}]}]",
        ]);
        let m = t.server.metrics.unwrap();
        assert!(
            m.metrics
                .iter()
                .any(|s| s.name == "requests_total" && s.drop)
        );
        // Later tags win per name; enum order.
        let t = merged(&[
            "metrics: [{overrides: [{tagOverrides: {add: {value: \"'bar'\"}}}]}]",
            "metrics: [{overrides: [{match: {metric: REQUEST_COUNT}, tagOverrides: {add: {value: \"'over'\"}}}]}]",
        ]);
        let m = t.client.metrics.unwrap();
        assert_eq!(m.metrics.len(), 10);
        assert_eq!(m.metrics[0].name, "request_messages_total");
        let rc = m
            .metrics
            .iter()
            .find(|s| s.name == "requests_total")
            .unwrap();
        assert_eq!(rc.dimensions["add"], "'over'");
        // No Prometheus in scope: no metrics.
        let t = merged(&["metrics: [{providers: [{name: stackdriver}]}]"]);
        assert_eq!(t.client.metrics, None);
    }
}
