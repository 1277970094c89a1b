//! What the test kubelet makes of a pod spec's volumes and env: volume contents written into the
//! pod's directory (mount paths are paths under it, the containers' working directory), env
//! values resolved as the kubelet resolves them, and the downward API's file format.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, EnvVar, KeyToPath, ObjectFieldSelector, Pod,
    ResourceFieldSelector, Secret, ServiceAccount, Volume,
};
use kube::api::{Api, PostParams};

/// The node's allocatable resources: what `resourceFieldRef` reads for a limit the container
/// does not set (as the kubelet does).
pub const NODE_CPU: &str = "2";
pub const NODE_MEMORY: &str = "24Gi";

/// A token the kubelet must keep fresh: rewritten when 80% of its life has passed.
#[derive(Debug, Clone)]
pub struct TokenFile {
    pub path: PathBuf,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
    pub refresh_at: Instant,
}

/// Writes every volume of `pod` under `root/.volumes/NAME` and returns the tokens to refresh.
/// A volume kind this kubelet cannot provide is an error naming the field.
pub async fn materialize(client: &kube::Client, pod: &Pod, root: &Path) -> Result<Vec<TokenFile>> {
    let spec = pod.spec.as_ref().context("pod without spec")?;
    let mut tokens = Vec::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let dir = root.join(".volumes").join(&v.name);
        fs::create_dir_all(&dir)?;
        let field = format!("spec.volumes[{i}] ({})", v.name);
        materialize_one(client, pod, v, &dir, &field, &mut tokens)
            .await
            .with_context(|| field.clone())?;
    }
    Ok(tokens)
}

async fn materialize_one(
    client: &kube::Client,
    pod: &Pod,
    v: &Volume,
    dir: &Path,
    field: &str,
    tokens: &mut Vec<TokenFile>,
) -> Result<()> {
    let ns = namespace(pod);
    if v.empty_dir.is_some() {
        // The kubelet makes emptyDirs world-writable (0777).
        fs::set_permissions(dir, fs::Permissions::from_mode(0o777))?;
    } else if let Some(cm) = &v.config_map {
        let data = config_map_data(client, &ns, &cm.name, cm.optional.unwrap_or(false)).await?;
        write_keys(dir, &data, cm.items.as_deref(), cm.default_mode)?;
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let data = secret_data(client, &ns, &name, s.optional.unwrap_or(false)).await?;
        write_keys(dir, &data, s.items.as_deref(), s.default_mode)?;
    } else if let Some(d) = &v.downward_api {
        for item in d.items.iter().flatten() {
            write_downward(pod, item, dir, d.default_mode)?;
        }
    } else if let Some(p) = &v.projected {
        for (j, src) in p.sources.iter().flatten().enumerate() {
            if let Some(t) = &src.service_account_token {
                let path = dir.join(&t.path);
                let expiration_seconds = t.expiration_seconds.unwrap_or(3600);
                let file = TokenFile {
                    path,
                    audience: t.audience.clone(),
                    expiration_seconds,
                    refresh_at: Instant::now(),
                };
                write_token(client, pod, &file).await?;
                tokens.push(TokenFile {
                    refresh_at: Instant::now()
                        + Duration::from_secs((expiration_seconds as u64) * 8 / 10),
                    ..file
                });
            } else if let Some(cm) = &src.config_map {
                let data =
                    config_map_data(client, &ns, &cm.name, cm.optional.unwrap_or(false)).await?;
                write_keys(dir, &data, cm.items.as_deref(), p.default_mode)?;
            } else if let Some(s) = &src.secret {
                let data = secret_data(client, &ns, &s.name, s.optional.unwrap_or(false)).await?;
                write_keys(dir, &data, s.items.as_deref(), p.default_mode)?;
            } else if let Some(d) = &src.downward_api {
                for item in d.items.iter().flatten() {
                    write_downward(pod, item, dir, p.default_mode)?;
                }
            } else {
                bail!(
                    "{field}: projected.sources[{j}] is a kind of source this kubelet cannot provide"
                );
            }
        }
    } else {
        bail!(
            "{field}: only emptyDir, configMap, secret, downwardAPI and projected volumes are \
             supported by this kubelet"
        );
    }
    Ok(())
}

/// Requests a token for the pod's service account (TokenRequest bound to the pod) and writes it.
pub async fn write_token(client: &kube::Client, pod: &Pod, file: &TokenFile) -> Result<()> {
    let spec = pod.spec.as_ref().context("pod without spec")?;
    let sa = spec
        .service_account_name
        .clone()
        .unwrap_or_else(|| "default".into());
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace(pod));
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: file.audience.clone().map(|a| vec![a]),
            expiration_seconds: Some(file.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        }),
        ..Default::default()
    };
    // The service account may be created in the same apply as the pod's Deployment: wait a bit.
    let deadline = Instant::now() + Duration::from_secs(30);
    let token = loop {
        match api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
        {
            Ok(t) => break t,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("TokenRequest for service account {sa}"));
            }
        }
    };
    let status = token.status.context("TokenRequest without status")?;
    write_file(
        &file.path,
        status.token.unwrap_or_default().as_bytes(),
        Some(0o644),
    )
}

async fn config_map_data(
    client: &kube::Client,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let Some(cm) = wait_for(&api, "configMap", name, optional).await? else {
        return Ok(BTreeMap::new());
    };
    let mut out: BTreeMap<String, Vec<u8>> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    out.extend(
        cm.binary_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0)),
    );
    Ok(out)
}

async fn secret_data(
    client: &kube::Client,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let Some(s) = wait_for(&api, "secret", name, optional).await? else {
        return Ok(BTreeMap::new());
    };
    let mut out: BTreeMap<String, Vec<u8>> = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    out.extend(
        s.string_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes())),
    );
    Ok(out)
}

/// Object `name` of `api`, as the kubelet waits for it: a missing one keeps the pod waiting
/// (istiod publishes istio-ca-root-cert a moment after a namespace appears), up to 60 s; an
/// optional one is `None` at once.
async fn wait_for<K>(api: &Api<K>, kind: &str, name: &str, optional: bool) -> Result<Option<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(o) = api.get_opt(name).await? {
            return Ok(Some(o));
        }
        if optional {
            return Ok(None);
        }
        if Instant::now() > deadline {
            let ns = api.namespace().unwrap_or_default();
            bail!("{kind} {ns}/{name} does not exist (waited 60 s)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
) -> Result<()> {
    match items {
        Some(items) => {
            for it in items {
                let value = data
                    .get(&it.key)
                    .with_context(|| format!("items: no key {}", it.key))?;
                write_file(&dir.join(&it.path), value, it.mode.or(default_mode))?;
            }
        }
        None => {
            for (k, v) in data {
                write_file(&dir.join(k), v, default_mode)?;
            }
        }
    }
    Ok(())
}

fn write_downward(
    pod: &Pod,
    item: &DownwardAPIVolumeFile,
    dir: &Path,
    default_mode: Option<i32>,
) -> Result<()> {
    let text = if let Some(f) = &item.field_ref {
        field_value(pod, f, true)?
    } else if item.resource_field_ref.is_some() {
        bail!(
            "downwardAPI {}: resourceFieldRef files are not supported by this kubelet",
            item.path
        );
    } else {
        bail!(
            "downwardAPI {}: neither fieldRef nor resourceFieldRef",
            item.path
        );
    };
    write_file(
        &dir.join(&item.path),
        text.as_bytes(),
        item.mode.or(default_mode),
    )
}

fn write_file(path: &Path, data: &[u8], mode: Option<i32>) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
        // Readable by the containers' users (the kubelet's volume directories are 0755).
        fs::set_permissions(parent, fs::Permissions::from_mode(0o755))?;
    }
    fs::write(path, data).with_context(|| format!("write {}", path.display()))?;
    let mode = u32::try_from(mode.unwrap_or(0o644)).unwrap_or(0o644);
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Makes each volume mount of `c` a link at `root/MOUNT_PATH` to the volume's directory. Two
/// containers may share a mount path only for the same volume (one directory serves the pod).
pub fn mount(
    c: &Container,
    root: &Path,
    field: &str,
    mounts: &mut HashMap<String, String>,
) -> Result<()> {
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let f = format!("{field}.volumeMounts[{i}] ({})", m.mount_path);
        if m.sub_path.as_deref().is_some_and(|s| !s.is_empty())
            || m.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty())
        {
            bail!("{f}: subPath is not supported by this kubelet");
        }
        if let Some(prev) = mounts.get(&m.mount_path) {
            if *prev != m.name {
                bail!(
                    "{f}: volume {} at a path another container mounts volume {prev} at (one \
                     directory per pod)",
                    m.name
                );
            }
            continue;
        }
        let target = root.join(".volumes").join(&m.name);
        if !target.is_dir() {
            bail!("{f}: no volume named {}", m.name);
        }
        let link = root.join(m.mount_path.trim_start_matches('/'));
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent)?;
        }
        std::os::unix::fs::symlink(&target, &link)
            .with_context(|| format!("{f}: link {}", link.display()))?;
        mounts.insert(m.mount_path.clone(), m.name.clone());
    }
    Ok(())
}

/// The env of container `c` as the kubelet gives it: envFrom, then env in order with `$(VAR)`
/// expanded from what came before.
pub async fn container_env(
    client: &kube::Client,
    pod: &Pod,
    c: &Container,
    field: &str,
) -> Result<Vec<(String, String)>> {
    let ns = namespace(pod);
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    };
    for (i, from) in c.env_from.iter().flatten().enumerate() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(r) = &from.config_map_ref {
            config_map_data(client, &ns, &r.name, r.optional.unwrap_or(false)).await?
        } else if let Some(r) = &from.secret_ref {
            secret_data(client, &ns, &r.name, r.optional.unwrap_or(false)).await?
        } else {
            bail!("{field}.envFrom[{i}]: neither configMapRef nor secretRef");
        };
        for (k, v) in data {
            set(
                &mut env,
                format!("{prefix}{k}"),
                String::from_utf8_lossy(&v).into(),
            );
        }
    }
    for (i, e) in c.env.iter().flatten().enumerate() {
        let f = format!("{field}.env[{i}] ({})", e.name);
        let value = env_value(client, pod, c, e, &env)
            .await
            .with_context(|| f.clone())?;
        set(&mut env, e.name.clone(), value);
    }
    Ok(env)
}

async fn env_value(
    client: &kube::Client,
    pod: &Pod,
    c: &Container,
    e: &EnvVar,
    before: &[(String, String)],
) -> Result<String> {
    let Some(from) = &e.value_from else {
        return Ok(expand(e.value.as_deref().unwrap_or_default(), before));
    };
    let ns = namespace(pod);
    if let Some(f) = &from.field_ref {
        return field_value(pod, f, false);
    }
    if let Some(r) = &from.resource_field_ref {
        return resource_value(c, r);
    }
    if let Some(k) = &from.config_map_key_ref {
        let data = config_map_data(client, &ns, &k.name, k.optional.unwrap_or(false)).await?;
        return Ok(data
            .get(&k.key)
            .map(|v| String::from_utf8_lossy(v).into())
            .unwrap_or_default());
    }
    if let Some(k) = &from.secret_key_ref {
        let data = secret_data(client, &ns, &k.name, k.optional.unwrap_or(false)).await?;
        return Ok(data
            .get(&k.key)
            .map(|v| String::from_utf8_lossy(v).into())
            .unwrap_or_default());
    }
    bail!("valueFrom: a source this kubelet cannot provide")
}

/// `$(VAR)` expanded from `env` (unknown references left as written, `$$` an escaped `$`).
pub fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A `fieldRef`'s value; `file` is true for downwardAPI volume files (labels and annotations
/// may be read whole there).
fn field_value(pod: &Pod, f: &ObjectFieldSelector, file: bool) -> Result<String> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let path = f.field_path.as_str();
    let map_key = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_string)
    };
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => namespace(pod),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "metadata.labels" if file => format_map(m.labels.as_ref()),
        "metadata.annotations" if file => format_map(m.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
        "status.podIPs" => status
            .and_then(|s| s.pod_ips.clone())
            .unwrap_or_default()
            .iter()
            .map(|p| p.ip.clone())
            .collect::<Vec<_>>()
            .join(","),
        "status.hostIP" => status.and_then(|s| s.host_ip.clone()).unwrap_or_default(),
        "status.hostIPs" => status
            .and_then(|s| s.host_ips.clone())
            .unwrap_or_default()
            .iter()
            .map(|p| p.ip.clone())
            .collect::<Vec<_>>()
            .join(","),
        _ => {
            if let Some(k) = map_key("metadata.labels['") {
                m.labels
                    .as_ref()
                    .and_then(|l| l.get(&k).cloned())
                    .unwrap_or_default()
            } else if let Some(k) = map_key("metadata.annotations['") {
                m.annotations
                    .as_ref()
                    .and_then(|l| l.get(&k).cloned())
                    .unwrap_or_default()
            } else {
                bail!("fieldRef {path} is not supported by this kubelet")
            }
        }
    })
}

/// Labels or annotations in the downward API's file format: `key="value"` lines, sorted, the
/// value quoted as Go's %q quotes it.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A `resourceFieldRef`: the container's limit (the node's allocatable when unset) or request,
/// divided by the divisor and rounded up, as the kubelet does.
fn resource_value(c: &Container, r: &ResourceFieldSelector) -> Result<String> {
    let res = c.resources.as_ref();
    let (kind, what) = r.resource.split_once('.').with_context(|| {
        format!(
            "resourceFieldRef {}: not limits.X or requests.X",
            r.resource
        )
    })?;
    let from = match kind {
        "limits" => res.and_then(|r| r.limits.as_ref()),
        "requests" => res.and_then(|r| r.requests.as_ref()),
        _ => bail!(
            "resourceFieldRef {}: not limits.X or requests.X",
            r.resource
        ),
    };
    let quantity = match from.and_then(|m| m.get(what)) {
        Some(q) => q.0.clone(),
        None => match (kind, what) {
            (_, "cpu") if kind == "limits" => NODE_CPU.into(),
            (_, "memory") if kind == "limits" => NODE_MEMORY.into(),
            _ => "0".into(),
        },
    };
    if !matches!(what, "cpu" | "memory" | "ephemeral-storage") {
        bail!("resourceFieldRef {}: unknown resource", r.resource);
    }
    let value = parse_quantity(&quantity)?;
    let divisor = r
        .divisor
        .as_ref()
        .map(|d| parse_quantity(&d.0))
        .transpose()?
        .unwrap_or(1.0);
    if divisor <= 0.0 {
        bail!("resourceFieldRef {}: divisor must be positive", r.resource);
    }
    Ok(format!("{}", (value / divisor).ceil() as i64))
}

/// A Kubernetes quantity ("100m", "1Gi", "2", "1.5") in base units.
pub fn parse_quantity(q: &str) -> Result<f64> {
    let q = q.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (s, mult) in suffixes {
        if let Some(n) = q.strip_suffix(s) {
            let v: f64 = n.parse().with_context(|| format!("quantity {q}"))?;
            return Ok(v * mult);
        }
    }
    q.parse().with_context(|| format!("quantity {q}"))
}

pub fn namespace(pod: &Pod) -> String {
    pod.metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_like_the_kubelet() {
        let env = vec![("POD_NAMESPACE".to_string(), "default".to_string())];
        assert_eq!(
            expand("$(POD_NAMESPACE).svc.cluster.local", &env),
            "default.svc.cluster.local"
        );
        assert_eq!(
            expand("$(MISSING)/$$(POD_NAMESPACE)", &env),
            "$(MISSING)/$(POD_NAMESPACE)"
        );
    }

    #[test]
    fn quantities_and_downward_format() {
        assert_eq!(parse_quantity("100m").unwrap(), 0.1);
        assert_eq!(parse_quantity("1Gi").unwrap(), 1073741824.0);
        let mut m = BTreeMap::new();
        m.insert("b".to_string(), "x\"y".to_string());
        m.insert("a".to_string(), "1".to_string());
        assert_eq!(format_map(Some(&m)), "a=\"1\"\nb=\"x\\\"y\"");
    }
}
