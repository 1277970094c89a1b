//! The metadata of a config document: the fields read (name, namespace, labels, creation time),
//! the ones Kubernetes sets that mean nothing here, and the warnings a document carries.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct Metadata {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// When the API server created the object (RFC 3339, so it sorts as text): the Gateway
    /// API orders conflicting routes oldest first.
    #[serde(
        default,
        rename = "creationTimestamp",
        skip_serializing_if = "Option::is_none"
    )]
    pub creation_timestamp: Option<Box<str>>,
    /// What was accepted but is not acted on (unknown fields, fields not applied), each naming
    /// the field: logged on load and shown by /debug/configz, never silently dropped.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Metadata fields Kubernetes sets or users write that mean nothing here but are no mistake.
pub(super) const KNOWN_METADATA: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "creationTimestamp",
    "uid",
    "resourceVersion",
    "generation",
    "managedFields",
    "ownerReferences",
    "finalizers",
    "generateName",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

impl Metadata {
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
}

/// A document's metadata, with a warning for each field that is neither ours nor one
/// Kubernetes sets; the name is required.
pub(super) fn parse_metadata(raw_meta: &serde_json::Value) -> Result<Metadata, String> {
    let mut meta = Metadata::deserialize(raw_meta).map_err(|e| format!("metadata: {e}"))?;
    if let Some(fields) = raw_meta.as_object() {
        for key in fields
            .keys()
            .filter(|k| !KNOWN_METADATA.contains(&k.as_str()))
        {
            meta.warnings.push(format!(
                "metadata.{key}: unknown field, ignored (the resource is in namespace {:?})",
                meta.namespace()
            ));
        }
    }
    if meta.name.is_empty() {
        return Err("metadata.name must not be empty".into());
    }
    Ok(meta)
}

/// Adds a warning for each field of `written` that `understood` (the typed value written back)
/// lacks: a field this control plane does not know, so does not act on.
pub(super) fn unknown_fields(
    written: &serde_json::Value,
    understood: &serde_json::Value,
    at: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (written, understood) {
        (Value::Object(w), Value::Object(u)) => {
            for (k, v) in w {
                match u.get(k) {
                    Some(uv) => unknown_fields(v, uv, &format!("{at}.{k}"), out),
                    None => out.push(format!("{at}.{k}: unknown field, ignored")),
                }
            }
        }
        (Value::Array(w), Value::Array(u)) => {
            for (i, (wv, uv)) in w.iter().zip(u).enumerate() {
                unknown_fields(wv, uv, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}
