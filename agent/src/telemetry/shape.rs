//! The Telemetry API's `metrics` overrides on the standard metrics, as Istio's stats filter
//! applies its `MetricConfig`s: a metric `drop`ped is not reported; `tags_to_remove` removes
//! standard labels; `dimensions` set a standard label's value in place, or add a label after
//! the standard ones. The shape comes with each batch of records (the logger's resource
//! attribute `istio.metrics`, written by istiod-core, or by the agent where it replaced an
//! istiod's `istio.stats`); the values of per-request dimensions come as record attributes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use istio_proto::otlp_logs::{KeyValue, any_value};
use mesh_common::telemetry::{Dimension, Shape, attr};

/// A record's dimension: its key (tag and source) and value.
pub type Dim = (Box<str>, Box<str>);

/// The shapes seen last, by their JSON (a logger sends the same one with every batch).
#[derive(Default)]
pub struct Shapes(Mutex<Vec<(String, Arc<Shape>)>>);

/// Distinct shapes remembered (one per logger configuration: a handful).
const REMEMBERED: usize = 16;

impl Shapes {
    /// The shape in a batch's resource attributes; `None` when it has none (no overrides).
    pub fn of(&self, resource: &[KeyValue]) -> Option<Arc<Shape>> {
        let json = resource.iter().find(|kv| kv.key == attr::SHAPE)?;
        let Some(any_value::Value::StringValue(json)) =
            json.value.as_ref().and_then(|v| v.value.as_ref())
        else {
            return None;
        };
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, shape)) = seen.iter().find(|(j, _)| j == json) {
            return Some(shape.clone());
        }
        let shape: Shape = match serde_json::from_str(json) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "a metrics shape that does not parse: the metrics are reported unshaped");
                return None;
            }
        };
        let shape = Arc::new(shape);
        if seen.len() >= REMEMBERED {
            seen.remove(0);
        }
        seen.push((json.clone(), shape.clone()));
        Some(shape)
    }
}

/// A dimension's key in a series: its tag and where its value comes from (metrics may give one
/// tag different values).
fn dim_key(tag: &str, d: &Dimension) -> String {
    match d {
        Dimension::Literal(l) => format!("{tag}\u{0}={l}"),
        Dimension::Attribute(a) => format!("{tag}\u{0}@{a}"),
    }
}

/// The dimensions a record carries under `shape`: every label any metric sets, by name, with
/// its value (a literal, the record's attribute, or `unknown` when Envoy had none).
pub fn dimensions<'r>(
    shape: &Shape,
    get: impl Fn(&str) -> Option<&'r str>,
) -> Vec<(String, String)> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for m in &shape.metrics {
        for (tag, d) in &m.set {
            let value = match d {
                Dimension::Literal(l) => l.clone(),
                Dimension::Attribute(a) => get(a).unwrap_or("unknown").to_string(),
            };
            out.insert(dim_key(tag, d), value);
        }
    }
    out.into_iter().collect()
}

/// One metric's labels under `shape`: `None` when it is dropped. `names`/`values` are the
/// standard labels, `dims` what [`dimensions`] gave for the record.
pub fn project(
    shape: &Shape,
    metric: &str,
    names: &[&str],
    values: &[Box<str>],
    dims: &[Dim],
) -> Option<Vec<(String, String)>> {
    let mut labels: Vec<(String, String)> = names
        .iter()
        .zip(values)
        .map(|(n, v)| ((*n).to_string(), v.to_string()))
        .collect();
    let Some(m) = shape.metrics.iter().find(|m| m.name == metric) else {
        return Some(labels);
    };
    if m.drop {
        return None;
    }
    labels.retain(|(n, _)| !m.remove.contains(n));
    for (tag, d) in &m.set {
        let key = dim_key(tag, d);
        let value = dims
            .iter()
            .find(|(k, _)| **k == *key)
            .map_or_else(|| "unknown".to_string(), |(_, v)| v.to_string());
        match labels.iter_mut().find(|(n, _)| n == tag) {
            Some(existing) => existing.1 = value,
            None => labels.push((tag.clone(), value)),
        }
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use mesh_common::telemetry::MetricShape;

    fn shape() -> Shape {
        Shape {
            metrics: vec![
                MetricShape {
                    name: "requests_total".into(),
                    drop: false,
                    remove: vec!["request_protocol".into()],
                    set: BTreeMap::from([
                        (
                            "request_host".to_string(),
                            Dimension::Attribute("dim.0".into()),
                        ),
                        ("source_app".to_string(), Dimension::Literal("fixed".into())),
                    ]),
                },
                MetricShape {
                    name: "request_bytes".into(),
                    drop: true,
                    ..Default::default()
                },
            ],
        }
    }

    #[test]
    fn drop_remove_and_set_as_istios_filter() {
        let s = shape();
        let dims: Vec<(Box<str>, Box<str>)> =
            dimensions(&s, |a| (a == "dim.0").then_some("h.example"))
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect();
        let names = ["reporter", "source_app", "request_protocol"];
        let values: Vec<Box<str>> = ["source", "a", "http"]
            .iter()
            .map(|v| (*v).into())
            .collect();
        let labels = project(&s, "requests_total", &names, &values, &dims).unwrap();
        assert_eq!(
            labels,
            vec![
                ("reporter".to_string(), "source".to_string()),
                ("source_app".to_string(), "fixed".to_string()),
                ("request_host".to_string(), "h.example".to_string()),
            ]
        );
        assert_eq!(project(&s, "request_bytes", &names, &values, &dims), None);
        // A metric the shape does not name keeps its standard labels.
        assert_eq!(
            project(&s, "response_bytes", &names, &values, &dims)
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn a_missing_attribute_is_unknown() {
        let dims = dimensions(&shape(), |_| None);
        assert!(dims.iter().any(|(_, v)| v == "unknown"));
    }
}
