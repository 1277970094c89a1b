//! `kubectl apply` for tests: multi-document YAML (or JSON) applied object by object with
//! server-side apply, each kind found through the API server's discovery.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use serde_json::Value;

/// The field manager of everything the tests apply.
pub const MANAGER: &str = "kube-cluster-test";

/// The objects in `text` (YAML documents separated by `---`, `List`s flattened), nulls dropped.
pub fn parse_objects(text: &str) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v: Value = serde::Deserialize::deserialize(doc).context("parse YAML document")?;
        if v.is_null() {
            continue;
        }
        if v["kind"].as_str().is_some_and(|k| k.ends_with("List")) && v["items"].is_array() {
            out.extend(v["items"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(v);
        }
    }
    Ok(out)
}

/// The API of `obj`'s kind, in `namespace` (the object's own, else this) when namespaced.
pub async fn api_for(
    client: &kube::Client,
    obj: &Value,
    namespace: Option<&str>,
) -> Result<Api<DynamicObject>> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the API server does not serve {api_version} {kind}"))?;
    Ok(match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .or(namespace)
                .unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
    })
}

/// Applies one object (server-side apply, conflicts forced) in `namespace` unless it names its own.
pub async fn apply_object(
    client: &kube::Client,
    obj: &Value,
    namespace: Option<&str>,
) -> Result<()> {
    let name = obj["metadata"]["name"]
        .as_str()
        .with_context(|| format!("object without metadata.name: {obj}"))?;
    let kind = obj["kind"].as_str().unwrap_or_default();
    let api = api_for(client, obj, namespace).await?;
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| format!("apply {kind} {name}"))?;
    Ok(())
}

/// Applies every object of `text`: CustomResourceDefinitions first (then waits until they are
/// established), then the rest in order.
pub async fn apply_yaml(client: &kube::Client, text: &str, namespace: Option<&str>) -> Result<()> {
    let objects = parse_objects(text)?;
    apply_all(client, &objects, namespace).await
}

pub async fn apply_all(
    client: &kube::Client,
    objects: &[Value],
    namespace: Option<&str>,
) -> Result<()> {
    let is_crd = |o: &&Value| o["kind"] == "CustomResourceDefinition";
    let crds: Vec<&Value> = objects.iter().filter(is_crd).collect();
    for o in &crds {
        apply_object(client, o, namespace).await?;
    }
    for o in &crds {
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        wait_established(client, name, Duration::from_secs(60)).await?;
    }
    for o in objects.iter().filter(|o| !is_crd(o)) {
        apply_object(client, o, namespace).await?;
    }
    Ok(())
}

/// Deletes every object of `text` (missing ones are fine).
pub async fn delete_yaml(client: &kube::Client, text: &str, namespace: Option<&str>) -> Result<()> {
    for obj in parse_objects(text)? {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let api = api_for(client, &obj, namespace).await?;
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("delete {name}")),
        }
    }
    Ok(())
}

async fn wait_established(client: &kube::Client, name: &str, limit: Duration) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let crd = crds.get(name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("CustomResourceDefinition {name} not established in {limit:?}")
}
