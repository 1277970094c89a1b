//! The config directory read resource by resource, as Istio's admission takes each object on its
//! own: a document that is invalid, of a kind not served here, too large, or over the endpoint
//! bounds is refused alone, named with its file, document and reason; its last good version (if
//! it had one) stays in force, and every other document of the directory applies. Size is
//! bounded before parsing (a document's bytes, a file's, the directory's), so memory follows the
//! input that is accepted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{ConfigError, ConfigSet, Resource, parse_document};

/// Largest document parsed. Kubernetes refuses objects over 1.5 MiB (etcd's request limit);
/// past this a document is refused before it is parsed, since a YAML parse costs many times the
/// text (a 50 MB ServiceEntry took 2.3 GB).
pub const MAX_DOCUMENT_BYTES: usize = 4 << 20;
/// Largest directory read, all files together; files past it (in name order) are refused.
pub const MAX_DIR_BYTES: u64 = 256 << 20;
/// Endpoints of one resource (a ServiceEntry's, an Endpoints' or an EndpointSlice's).
pub const MAX_ENDPOINTS_PER_RESOURCE: usize = 50_000;
/// Endpoints of the whole directory; resources that would pass it are refused.
pub const MAX_ENDPOINTS_TOTAL: usize = 1_000_000;

/// The bounds of a load (the constants above; tests lower them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub document_bytes: usize,
    pub dir_bytes: u64,
    pub endpoints_per_resource: usize,
    pub endpoints_total: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            document_bytes: MAX_DOCUMENT_BYTES,
            dir_bytes: MAX_DIR_BYTES,
            endpoints_per_resource: MAX_ENDPOINTS_PER_RESOURCE,
            endpoints_total: MAX_ENDPOINTS_TOTAL,
        }
    }
}

/// The documents of one file's text: (number from 1, text). Documents are split at `---` lines,
/// as YAML does; a first document with nothing in it (comments before the first `---`) is not
/// counted.
pub fn documents(contents: &str) -> Vec<(usize, &str)> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut at = 0;
    for line in contents.split_inclusive('\n') {
        let marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace));
        if marker {
            pieces.push(&contents[start..at]);
            // What follows the marker on its line belongs to the next document.
            start = at + 3;
        }
        at += line.len();
    }
    pieces.push(&contents[start..]);
    if pieces.len() > 1 && pieces.first().is_some_and(|p| blank(p)) {
        pieces.remove(0);
    }
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i + 1, p))
        .collect()
}

/// Nothing but blank lines and comments.
fn blank(text: &str) -> bool {
    text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#')
    })
}

/// One document's text as a resource (`None`: empty, or no config of ours), within the size and
/// endpoint bounds.
pub fn parse_document_text(text: &str) -> Result<Option<Resource>, String> {
    Ok(parse_document_value(text, &Bounds::default())?.1)
}

/// One document's text as its identity (when it names one) and resource.
fn parse_document_value(
    text: &str,
    bounds: &Bounds,
) -> Result<(Option<Key>, Option<Resource>), String> {
    if text.len() > bounds.document_bytes {
        return Err(format!(
            "document of {} bytes is over the limit of {} bytes ({} MiB; Kubernetes refuses \
             objects over 1.5 MiB); not parsed",
            text.len(),
            bounds.document_bytes,
            bounds.document_bytes >> 20
        ));
    }
    if blank(text) {
        return Ok((None, None));
    }
    let value: serde_json::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    parse_object(value, bounds)
}

/// One object (a document, or what the API server sent) as its identity (when it names one)
/// and resource, within the per-resource endpoint bound; errors name the object.
pub fn parse_object(
    value: serde_json::Value,
    bounds: &Bounds,
) -> Result<(Option<Key>, Option<Resource>), String> {
    let key = Key::of_value(&value);
    let resource = parse_document(value).map_err(|e| with_key(key.as_ref(), e))?;
    if let Some(r) = &resource {
        let n = endpoint_count(r);
        if n > bounds.endpoints_per_resource {
            return Err(with_key(
                key.as_ref(),
                format!(
                    "{n} endpoints are over the limit of {} for one resource",
                    bounds.endpoints_per_resource
                ),
            ));
        }
    }
    Ok((key, resource))
}

fn with_key(key: Option<&Key>, reason: String) -> String {
    match key {
        Some(k) if !reason.starts_with(&format!("{} {}", k.kind, k.name)) => {
            format!("{k}: {reason}")
        }
        _ => reason,
    }
}

/// The endpoints a resource lists.
pub fn endpoint_count(r: &Resource) -> usize {
    match r {
        Resource::ServiceEntry(_, s) => s.endpoints.len(),
        Resource::Endpoints(_, subsets) => subsets.iter().map(|s| s.addresses.len()).sum(),
        Resource::EndpointSlice(_, s) => s.endpoints.iter().map(|e| e.addresses.len()).sum(),
        _ => 0,
    }
}

/// Which object a document is: kind, namespace and name, as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn of(r: &Resource) -> Key {
        Key {
            kind: r.kind().to_string(),
            namespace: r.metadata().namespace().to_string(),
            name: r.metadata().name.clone(),
        }
    }

    /// The object a document names, if it names one (kind and metadata.name as strings).
    fn of_value(v: &serde_json::Value) -> Option<Key> {
        let meta = v.get("metadata")?;
        let mut kind = v.get("kind")?.as_str()?;
        // A Gateway API Gateway is not an Istio Gateway: keyed as Istio keys it.
        if kind == "Gateway"
            && super::gateway_api::in_group(v.get("apiVersion").and_then(|a| a.as_str()))
        {
            kind = super::gateway_api::GATEWAY_KIND;
        }
        Some(Key {
            kind: kind.to_string(),
            namespace: meta
                .get("namespace")
                .and_then(|n| n.as_str())
                .unwrap_or("default")
                .to_string(),
            name: meta.get("name")?.as_str()?.to_string(),
        })
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A document, file or resource refused by a load.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rejection {
    /// Where it was read from (`None`: refused when the registry was built from it).
    pub file: Option<PathBuf>,
    /// The document's number in its file (`None`: the whole file).
    pub document: Option<usize>,
    /// The object, when the document names one.
    pub object: Option<String>,
    pub reason: String,
    /// Whether an earlier version stays in force in its place.
    pub last_good_kept: bool,
    /// The objects whose version in force is to stay (the snapshot builder puts them back).
    #[serde(skip)]
    pub keep: Vec<Key>,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if let Some(doc) = self.document {
            write!(f, "document {doc}: ")?;
        }
        write!(f, "{}; ", self.reason)?;
        f.write_str(if self.last_good_kept {
            "refused, its last good version stays in force"
        } else {
            "refused, not applied"
        })
    }
}

/// The objects of each file at the last load: what a refused document falls back to (their
/// versions in force are the snapshot's, put back by the snapshot builder).
#[derive(Debug, Clone, Default)]
pub struct LastGood {
    by_file: BTreeMap<PathBuf, Vec<Key>>,
}

/// One load of the directory.
#[derive(Debug, Clone, Default)]
pub struct DirLoad {
    pub resources: Vec<Resource>,
    pub rejected: Vec<Rejection>,
    pub last_good: LastGood,
}

/// Loads `dir` document by document, falling back to `last` for what is refused. Fails only
/// when the directory itself cannot be listed.
pub fn load_dir_each(dir: &Path, last: &LastGood, bounds: &Bounds) -> Result<DirLoad, ConfigError> {
    let files = config_files(dir)?;
    let previous: BTreeSet<&Key> = last.by_file.values().flatten().collect();
    let mut out = DirLoad::default();
    let (mut bytes, mut endpoints) = (0u64, 0usize);
    for file in files {
        let old = last.by_file.get(&file);
        let refuse_file = |reason: String, out: &mut DirLoad| {
            let keep = old.cloned().unwrap_or_default();
            out.rejected.push(Rejection {
                file: Some(file.clone()),
                document: None,
                object: None,
                reason,
                last_good_kept: !keep.is_empty(),
                keep: keep.clone(),
            });
            out.last_good.by_file.insert(file.clone(), keep);
        };
        let text = match read_config_file(&file) {
            Ok(t) => t,
            Err(e) => {
                refuse_file(e.to_string(), &mut out);
                continue;
            }
        };
        if bytes + text.len() as u64 > bounds.dir_bytes {
            refuse_file(
                format!(
                    "with this file the config directory is over its limit of {} bytes",
                    bounds.dir_bytes
                ),
                &mut out,
            );
            continue;
        }
        bytes += text.len() as u64;
        // Every object a document names now, and those of them in force (or kept).
        let (mut mentioned, mut in_force): (Vec<Key>, Vec<Key>) = (Vec::new(), Vec::new());
        let mut unnamed_refused = None;
        for (doc, text) in documents(&text) {
            let parsed = parse_document_value(text, bounds).and_then(|(key, r)| match r {
                Some(r) => {
                    let n = endpoint_count(&r);
                    if endpoints + n > bounds.endpoints_total {
                        Err(with_key(
                            key.as_ref(),
                            format!(
                                "its {n} endpoints would take the directory over its limit of \
                                 {} endpoints",
                                bounds.endpoints_total
                            ),
                        ))
                    } else {
                        endpoints += n;
                        Ok(Some(r))
                    }
                }
                None => Ok(None),
            });
            match parsed {
                Ok(Some(r)) => {
                    mentioned.push(Key::of(&r));
                    in_force.push(Key::of(&r));
                    out.resources.push(r);
                }
                Ok(None) => {}
                Err(reason) => {
                    // The document's identity, read again: it is small enough to have been
                    // parsed, or it is not named at all.
                    let key = (text.len() <= bounds.document_bytes)
                        .then(|| serde_yaml_ng::from_str::<serde_json::Value>(text).ok())
                        .flatten()
                        .and_then(|v| Key::of_value(&v));
                    let kept = key.as_ref().is_some_and(|k| previous.contains(k));
                    if key.is_none() {
                        unnamed_refused = Some(out.rejected.len());
                    }
                    out.rejected.push(Rejection {
                        file: Some(file.clone()),
                        document: Some(doc),
                        object: key.as_ref().map(ToString::to_string),
                        reason,
                        last_good_kept: kept,
                        keep: key.iter().filter(|_| kept).cloned().collect(),
                    });
                    if kept {
                        in_force.extend(key.clone());
                    }
                    mentioned.extend(key);
                }
            }
        }
        // A document refused before it could be named (a YAML error, over the size limit):
        // the file's earlier objects that no document of it names now stay.
        if let (Some(at), Some(old)) = (unnamed_refused, old) {
            let keep: Vec<Key> = old
                .iter()
                .filter(|k| !mentioned.contains(k))
                .cloned()
                .collect();
            if let Some(r) = out.rejected.get_mut(at) {
                r.last_good_kept = !keep.is_empty();
                in_force.extend(keep.iter().cloned());
                r.keep = keep;
            }
        }
        out.last_good.by_file.insert(file, in_force);
    }
    Ok(out)
}

/// The config files of `dir`: every `.yaml`, `.yml` and `.json` file (not recursive), in name order.
pub(super) fn config_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ConfigError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Largest config file read: far above any real one (Kubernetes caps an object at 1.5 MiB), small
/// enough that a stray dump or a file still growing cannot take the control plane's memory.
pub const MAX_CONFIG_FILE_BYTES: u64 = 64 << 20;

/// One config file's text, refused past `MAX_CONFIG_FILE_BYTES`.
pub(super) fn read_config_file(file: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let fail = |source| ConfigError::ReadFile {
        file: file.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(file).map_err(fail)?;
    // Sized once from the file's length (within the limit): growing by doubling would hold
    // two buffers at the end, twice the file.
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut text =
        String::with_capacity(usize::try_from(len.min(MAX_CONFIG_FILE_BYTES) + 1).unwrap_or(0));
    f.take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(fail)?;
    if text.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(fail(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_CONFIG_FILE_BYTES >> 20
        ))));
    }
    Ok(text)
}

/// Checks every file of `dir` and returns every error (not only the first), with the resources
/// of the files that did load.
pub fn validate_dir(dir: &Path) -> (ConfigSet, Vec<ConfigError>) {
    let mut set = ConfigSet::default();
    let mut errors = Vec::new();
    let files = match config_files(dir) {
        Ok(f) => f,
        Err(e) => return (set, vec![e]),
    };
    for file in files {
        match read_config_file(&file).and_then(|contents| parse_file(&file, &contents)) {
            Ok(resources) => set.resources.extend(resources),
            Err(e) => errors.push(e),
        }
    }
    (set, errors)
}

/// Loads every `.yaml`, `.yml` and `.json` file of `dir` (not recursive), in name order.
pub fn load_dir(dir: &Path) -> Result<ConfigSet, ConfigError> {
    let files = config_files(dir)?;
    let mut set = ConfigSet::default();
    for file in files {
        let contents = read_config_file(&file)?;
        set.resources.extend(parse_file(&file, &contents)?);
    }
    Ok(set)
}

/// Parses every document in one file's contents (YAML, which includes JSON).
pub fn parse_file(path: &Path, contents: &str) -> Result<Vec<Resource>, ConfigError> {
    let mut out = Vec::new();
    for (doc, text) in documents(contents) {
        let resource = parse_document_text(text).map_err(|reason| ConfigError::Invalid {
            file: path.to_path_buf(),
            doc,
            reason,
        })?;
        out.extend(resource);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_split_at_markers_as_yaml_does() {
        let docs = documents("# head\n---\nkind: A\n---\nkind: B\n--- \nkind: C\n----x: 1\n");
        let texts: Vec<(usize, &str)> = docs;
        assert_eq!(texts.len(), 3, "{texts:?}");
        assert_eq!(texts[0], (1, "\nkind: A\n"));
        assert_eq!(texts[1], (2, "\nkind: B\n"));
        assert_eq!(texts[2].0, 3);
        assert!(texts[2].1.contains("kind: C\n----x: 1"));
        assert_eq!(documents("kind: A\n").len(), 1);
    }

    fn se(name: &str, endpoints: usize) -> String {
        let eps: Vec<String> = (0..endpoints)
            .map(|i| format!("{{address: 10.{}.{}.{}}}", i >> 16, (i >> 8) & 255, i & 255))
            .collect();
        format!(
            "kind: ServiceEntry\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{hosts: [{name}.example.com], ports: [{{number: 80, name: http}}], endpoints: [{}]}}\n",
            eps.join(", ")
        )
    }

    #[test]
    fn oversized_documents_and_resources_are_refused_by_name() {
        let big = format!(
            "kind: ConfigMap\nmetadata: {{name: x}}\ndata: {{a: {}}}\n",
            "a".repeat(MAX_DOCUMENT_BYTES)
        );
        let e = parse_document_text(&big).unwrap_err();
        assert!(e.contains("over the limit of 4194304 bytes (4 MiB"), "{e}");
        let e = parse_document_text(&se("many", MAX_ENDPOINTS_PER_RESOURCE + 1)).unwrap_err();
        assert!(
            e.starts_with("ServiceEntry ns/many: 50001 endpoints are over the limit"),
            "{e}"
        );
    }

    #[test]
    fn a_refused_document_keeps_its_last_good_version_and_the_rest_applies() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("mesh.yaml");
        std::fs::write(&f, format!("{}---\n{}", se("a", 1), se("b", 1))).unwrap();
        let first = load_dir_each(dir.path(), &LastGood::default(), &Bounds::default()).unwrap();
        assert_eq!(first.resources.len(), 2);
        assert!(first.rejected.is_empty());
        // b broken, c new and broken, d new and good, one Gateway API Gateway without its class:
        // only d changes.
        let broken_b = se("b", 1).replace("hosts:", "hosts: 7, x:");
        std::fs::write(
            &f,
            format!(
                "{}---\n{broken_b}---\nkind: ServiceEntry\nmetadata: {{name: c, namespace: ns}}\nspec: {{ports: 5}}\n---\n{}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: ns}}\nspec: {{listeners: []}}\n",
                se("a", 1),
                se("d", 1)
            ),
        )
        .unwrap();
        let second = load_dir_each(dir.path(), &first.last_good, &Bounds::default()).unwrap();
        let names = |load: &DirLoad| -> Vec<String> {
            load.resources
                .iter()
                .map(|r| Key::of(r).to_string())
                .collect()
        };
        assert_eq!(names(&second), ["ServiceEntry ns/a", "ServiceEntry ns/d"]);
        // b's version in force is to stay (the snapshot builder puts it back); c had none.
        assert_eq!(second.rejected[0].keep, [Key::of(&first.resources[1])]);
        assert!(second.rejected[1].keep.is_empty());
        let refused: Vec<(Option<usize>, Option<&str>, bool)> = second
            .rejected
            .iter()
            .map(|r| (r.document, r.object.as_deref(), r.last_good_kept))
            .collect();
        assert_eq!(
            refused,
            [
                (Some(2), Some("ServiceEntry ns/b"), true),
                (Some(3), Some("ServiceEntry ns/c"), false),
                (Some(5), Some("KubernetesGateway ns/gw"), false),
            ]
        );
        assert!(
            second.rejected[2]
                .reason
                .contains("Gateway gw: missing field `gatewayClassName`"),
            "{}",
            second.rejected[2]
        );
        // A YAML error names nothing: the file's earlier resources it no longer names stay.
        std::fs::write(&f, format!("{}---\nkind: [\n", se("a", 1))).unwrap();
        let third = load_dir_each(dir.path(), &second.last_good, &Bounds::default()).unwrap();
        assert_eq!(names(&third), ["ServiceEntry ns/a"]);
        let keep: Vec<String> = third.rejected[0]
            .keep
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(keep, ["ServiceEntry ns/b", "ServiceEntry ns/d"]);
        assert!(third.rejected[0].last_good_kept);
    }

    #[test]
    fn the_directory_and_its_endpoints_are_bounded_in_total() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..4 {
            std::fs::write(
                dir.path().join(format!("{i}.yaml")),
                se(&format!("s{i}"), 40),
            )
            .unwrap();
        }
        let bounds = Bounds {
            endpoints_total: 100,
            ..Bounds::default()
        };
        let load = load_dir_each(dir.path(), &LastGood::default(), &bounds).unwrap();
        assert_eq!(load.resources.len(), 2);
        assert_eq!(load.rejected.len(), 2, "{:?}", load.rejected);
        let said = load.rejected[0].to_string();
        assert!(
            said.ends_with("2.yaml: document 1: ServiceEntry ns/s2: its 40 endpoints would take the directory over its limit of 100 endpoints; refused, not applied"),
            "{said}"
        );
        let size = std::fs::metadata(dir.path().join("0.yaml")).unwrap().len();
        let bounds = Bounds {
            dir_bytes: size * 3,
            ..Bounds::default()
        };
        let load = load_dir_each(dir.path(), &LastGood::default(), &bounds).unwrap();
        assert_eq!(load.resources.len(), 3);
        let said = load.rejected[0].to_string();
        assert!(
            said.contains("3.yaml: with this file the config directory is over its limit"),
            "{said}"
        );
    }
}
