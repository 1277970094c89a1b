//! Gateway deployment, as istiod's gateway deployment controller does it
//! (`pilot/pkg/config/kube/gatewaycommon/deploymentcontroller.go`, the template
//! `istio-discovery/files/kube-gateway.yaml`): every Gateway API Gateway of a class this control
//! plane serves (`gateway_api::served_gateways`) gets a ServiceAccount, a Deployment of routers
//! (`proxy router`) and a LoadBalancer Service, all named `NAME-CLASS` in its namespace, each
//! owned by the Gateway (so the garbage collector removes them with it), written by server-side
//! apply as `istio.io/gateway-controller`. istiod-core runs no injector, so the pod template is
//! complete as rendered; the proxy image and its settings come from the injector's `values`
//! (ConfigMap `istio-sidecar-injector`), as Istio's template reads them.
//!
//! The Gateway's `spec.infrastructure` labels and annotations go on every object and on the
//! pods (the controller's own labels over them), as the Gateway API asks.
//!
//! Also as istiod: the GatewayClass `istio` is created when the Gateway API CRDs are installed
//! and it does not exist. Not done: the HorizontalPodAutoscaler and PodDisruptionBudget
//! (istiod renders them only when asked), the
//! Gateway's customization annotations and ConfigMap parameters, leader election (every
//! replica applies the same objects; the applies are idempotent).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::source::KubeSource;
use crate::config_store::Metadata;
use crate::config_store::gateway_api::{GROUP, GatewaySpec};
use crate::gateway_conversion::{CONTROLLER, DEFAULT_CLASS, GATEWAY_NAME_LABEL, served_gateways};
use crate::store::ConfigStore;

/// The field manager of every write (istiod's).
pub const MANAGER: &str = CONTROLLER;
/// The label on deployed objects saying who manages them.
pub const MANAGED_LABEL: &str = "gateway.istio.io/managed";
pub const MANAGED_VALUE: &str = "istio.io-gateway-controller";
pub const CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";
/// The router's readiness port, always in the Service.
pub const STATUS_PORT: u16 = 15021;
/// How often everything is applied again (someone deleted or edited a Deployment, the
/// injector's values changed), and the GatewayClass checked.
const RESYNC: Duration = Duration::from_secs(60);
/// The longest wait before a failed round is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
const GATEWAY_API_VERSION: &str = "gateway.networking.k8s.io/v1";
const GATEWAY_CLASS_CRD: &str = "gatewayclasses.gateway.networking.k8s.io";

/// What the controller is given at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// istiod-core's namespace, where the injector's ConfigMap is.
    pub istio_namespace: String,
    /// The injector's ConfigMap (`istio-sidecar-injector`).
    pub injector_config_map: String,
    /// ISTIO_RS_PROXY_IMAGE: the image when that ConfigMap is missing.
    pub fallback_image: Option<String>,
    pub trust_domain: String,
    pub domain_suffix: String,
}

/// The proxy container's settings, from the injector's values (`global.*`) with Istio's
/// defaults for what they leave out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyTemplate {
    pub image: String,
    pub image_pull_policy: Option<String>,
    pub proxy_log_level: String,
    pub component_log_level: String,
    pub agent_log_level: String,
    /// `global.pilotCertProvider`: `istiod` mounts the root ConfigMap.
    pub cert_provider: String,
    pub ca_address: String,
    pub cluster_id: String,
    pub cluster_domain: String,
    pub mesh_id: String,
    pub trust_domain: String,
    /// The audience of the `istio-token` volume (`global.sds.token.aud`).
    pub token_audience: String,
    /// `global.proxy.resources`, nulls left out.
    pub resources: Option<Value>,
    /// `istio.io/rev` of the pods.
    pub revision: String,
}

/// Why a Gateway could not be deployed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error(
        "no proxy image for Gateway deployments: ConfigMap {namespace}/{config_map} (the injector's values) \
         is missing and {env} is unset; deploying no Gateway until one of them is there"
    )]
    NoImage {
        namespace: String,
        config_map: String,
        env: &'static str,
    },
    #[error("ConfigMap {namespace}/{config_map}, key values: {reason}")]
    Values {
        namespace: String,
        config_map: String,
        reason: String,
    },
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DeployError {
    let what = what.into();
    move |source| DeployError::Api { what, source }
}

/// A string at `path` of `values`, when set and not empty.
fn string_at(values: &Value, path: &[&str]) -> Option<String> {
    let mut v = values;
    for key in path {
        v = v.get(key)?;
    }
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        // Helm values may hold a tag as a number.
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Drops null members (Helm leaves `limits: null` and the like).
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A value of `global` in the injector's values, when set and not empty.
fn global(values: &Value, path: &[&str]) -> Option<String> {
    let mut full = vec!["global"];
    full.extend_from_slice(path);
    string_at(values, &full)
}

impl ProxyTemplate {
    /// From the injector's `values` JSON: the image is `global.proxy.image` when it names a
    /// registry (has a `/`), else `{global.hub}/{global.proxy.image or proxyv2}:{global.tag}`.
    pub fn from_values(values: &Value, s: &Settings) -> Result<ProxyTemplate, String> {
        let name = global(values, &["proxy", "image"]).unwrap_or_else(|| "proxyv2".into());
        let image = if name.contains('/') {
            name
        } else {
            let hub = global(values, &["hub"]).ok_or("global.hub is not set")?;
            let tag = global(values, &["tag"]).ok_or("global.tag is not set")?;
            format!("{hub}/{name}:{tag}")
        };
        Ok(ProxyTemplate::with(image, values, s))
    }

    /// `image` with Istio's defaults for the rest (ISTIO_RS_PROXY_IMAGE).
    pub fn from_image(image: &str, s: &Settings) -> ProxyTemplate {
        ProxyTemplate::with(image.to_string(), &Value::Null, s)
    }

    fn with(image: String, values: &Value, s: &Settings) -> ProxyTemplate {
        let g = |path: &[&str]| global(values, path);
        let revision = string_at(values, &["revision"]);
        let istio_namespace = g(&["istioNamespace"]).unwrap_or_else(|| s.istio_namespace.clone());
        let istiod = match &revision {
            Some(rev) => format!("istiod-{rev}"),
            None => "istiod".into(),
        };
        ProxyTemplate {
            image,
            image_pull_policy: g(&["imagePullPolicy"]),
            proxy_log_level: g(&["proxy", "logLevel"]).unwrap_or_else(|| "warning".into()),
            component_log_level: g(&["proxy", "componentLogLevel"])
                .unwrap_or_else(|| "misc:error".into()),
            agent_log_level: g(&["logging", "level"]).unwrap_or_else(|| "default:info".into()),
            cert_provider: g(&["pilotCertProvider"]).unwrap_or_else(|| "istiod".into()),
            ca_address: g(&["caAddress"])
                .unwrap_or_else(|| format!("{istiod}.{istio_namespace}.svc:15012")),
            cluster_id: g(&["multiCluster", "clusterName"]).unwrap_or_else(|| "Kubernetes".into()),
            cluster_domain: g(&["proxy", "clusterDomain"])
                .unwrap_or_else(|| s.domain_suffix.clone()),
            mesh_id: g(&["meshID"]).unwrap_or_else(|| s.trust_domain.clone()),
            trust_domain: s.trust_domain.clone(),
            token_audience: g(&["sds", "token", "aud"]).unwrap_or_else(|| "istio-ca".into()),
            resources: values
                .pointer("/global/proxy/resources")
                .filter(|r| r.is_object())
                .map(without_nulls),
            revision: revision.unwrap_or_else(|| "default".into()),
        }
    }
}

/// One Gateway to deploy: where it is, its uid (for the owner references) and its spec.
#[derive(Debug, Clone, Copy)]
pub struct GatewayRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub spec: &'a GatewaySpec,
}

impl GatewayRef<'_> {
    /// `NAME-CLASS`: the name of every object deployed for it (istiod's default name).
    pub fn deployment_name(&self) -> String {
        format!("{}-{}", self.name, self.spec.gateway_class_name)
    }

    fn owner(&self) -> Value {
        json!([{
            "apiVersion": GATEWAY_API_VERSION,
            "kind": "Gateway",
            "name": self.name,
            "uid": self.uid,
            "controller": true,
        }])
    }

    /// The labels of every deployed object: the Gateway's `spec.infrastructure.labels`, then
    /// the controller's own over them.
    fn labels(&self, managed: bool) -> Value {
        let mut l = json!(self.infrastructure(|i| &i.labels));
        l[GATEWAY_NAME_LABEL] = json!(self.name);
        l[CLASS_LABEL] = json!(self.spec.gateway_class_name);
        if managed {
            l[MANAGED_LABEL] = json!(MANAGED_VALUE);
        }
        l
    }

    /// A map of the Gateway's `spec.infrastructure` (empty without one).
    fn infrastructure(
        &self,
        field: impl Fn(
            &crate::config_store::gateway_api::GatewayInfrastructure,
        ) -> &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        self.spec
            .infrastructure
            .as_ref()
            .map(|i| field(i).clone())
            .unwrap_or_default()
    }
}

/// Whether istiod deploys a Gateway: not when its address is a hostname (it names an existing
/// Service), nor when it has several addresses; one IP address is the Service's
/// `loadBalancerIP`.
pub fn is_managed(spec: &GatewaySpec) -> bool {
    match spec.addresses.as_slice() {
        [] => true,
        [one] => one.type_.as_deref().is_none_or(|t| t == "IPAddress"),
        _ => false,
    }
}

/// The Service's ports: `status-port` (15021), then one per distinct listener port, named
/// `PROTOCOL-PORT` in lower case, its appProtocol the listener's protocol. A listener on 15021
/// shares the status port (a Service cannot list one port twice).
pub fn service_ports(spec: &GatewaySpec) -> Vec<Value> {
    let mut ports = vec![json!({
        "name": "status-port",
        "port": STATUS_PORT,
        "protocol": "TCP",
        "appProtocol": "tcp",
    })];
    let mut seen = std::collections::BTreeSet::from([STATUS_PORT]);
    for l in &spec.listeners {
        if !seen.insert(l.port) {
            continue;
        }
        let protocol = l.protocol.to_lowercase();
        ports.push(json!({
            "name": format!("{protocol}-{}", l.port),
            "port": l.port,
            "protocol": "TCP",
            "appProtocol": protocol,
        }));
    }
    ports
}

/// The three objects of one Gateway, as applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub service_account: Value,
    pub deployment: Value,
    pub service: Value,
}

/// The ServiceAccount, Deployment and Service istiod's template renders for `gw` with `t`.
pub fn render(gw: &GatewayRef, t: &ProxyTemplate) -> Rendered {
    let name = gw.deployment_name();
    let meta = |managed: bool| {
        json!({
            "name": name,
            "namespace": gw.namespace,
            "labels": gw.labels(managed),
            "annotations": gw.infrastructure(|i| &i.annotations),
            "ownerReferences": gw.owner(),
        })
    };
    let service_account = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(false),
    });
    let mut service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(false),
        "spec": {
            "type": "LoadBalancer",
            "ipFamilyPolicy": "PreferDualStack",
            "ports": service_ports(gw.spec),
            "selector": {GATEWAY_NAME_LABEL: gw.name},
        },
    });
    // One address with a value is the load balancer's; without one the cloud picks it.
    if let [address] = gw.spec.addresses.as_slice()
        && let Some(ip) = &address.value
    {
        service["spec"]["loadBalancerIP"] = json!(ip);
    }
    let mut pod_labels = json!({
        "sidecar.istio.io/inject": "false",
        "service.istio.io/canonical-name": name,
        "service.istio.io/canonical-revision": "latest",
    });
    if let (Some(into), Value::Object(from)) = (pod_labels.as_object_mut(), gw.labels(true)) {
        into.extend(from);
    }
    let mut pod_annotations = json!(gw.infrastructure(|i| &i.annotations));
    for (k, v) in [
        ("istio.io/rev", t.revision.as_str()),
        ("prometheus.io/path", "/stats/prometheus"),
        ("prometheus.io/port", "15020"),
        ("prometheus.io/scrape", "true"),
    ] {
        pod_annotations[k] = json!(v);
    }
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(true),
        "spec": {
            "selector": {"matchLabels": {GATEWAY_NAME_LABEL: gw.name}},
            "template": {
                "metadata": {
                    "annotations": pod_annotations,
                    "labels": pod_labels,
                },
                "spec": pod_spec(&name, gw.namespace, t),
            },
        },
    });
    Rendered {
        service_account,
        deployment,
        service,
    }
}

fn field(path: &str) -> Value {
    json!({"valueFrom": {"fieldRef": {"fieldPath": path}}})
}

fn resource(name: &str) -> Value {
    json!({"valueFrom": {"resourceFieldRef": {"resource": name, "divisor": "1"}}})
}

/// The router pod: one `istio-proxy` container running `proxy router`, as istiod's template
/// has it (no injection follows).
fn pod_spec(name: &str, namespace: &str, t: &ProxyTemplate) -> Value {
    let ready = json!({"path": "/healthz/ready", "port": STATUS_PORT, "scheme": "HTTP"});
    let mut env: Vec<Value> = Vec::new();
    let mut var = |n: &str, v: Value| {
        let mut e = v;
        e["name"] = json!(n);
        env.push(e);
    };
    var("PILOT_CERT_PROVIDER", json!({"value": t.cert_provider}));
    var("CA_ADDR", json!({"value": t.ca_address}));
    var("POD_NAME", field("metadata.name"));
    var("POD_NAMESPACE", field("metadata.namespace"));
    var("INSTANCE_IP", field("status.podIP"));
    var("SERVICE_ACCOUNT", field("spec.serviceAccountName"));
    var("HOST_IP", field("status.hostIP"));
    var("ISTIO_CPU_LIMIT", resource("limits.cpu"));
    var("PROXY_CONFIG", json!({"value": "{}\n"}));
    var("ISTIO_META_POD_PORTS", json!({"value": "[]"}));
    var("ISTIO_META_APP_CONTAINERS", json!({"value": ""}));
    var("GOMEMLIMIT", resource("limits.memory"));
    var("GOMAXPROCS", resource("limits.cpu"));
    var("ISTIO_META_CLUSTER_ID", json!({"value": t.cluster_id}));
    var("ISTIO_META_NODE_NAME", field("spec.nodeName"));
    var("ISTIO_META_INTERCEPTION_MODE", json!({"value": "REDIRECT"}));
    var("ISTIO_META_WORKLOAD_NAME", json!({"value": name}));
    var(
        "ISTIO_META_OWNER",
        json!({"value": format!("kubernetes://apis/apps/v1/namespaces/{namespace}/deployments/{name}")}),
    );
    var("ISTIO_META_MESH_ID", json!({"value": t.mesh_id}));
    var("TRUST_DOMAIN", json!({"value": t.trust_domain}));
    let istiod_ca = t.cert_provider == "istiod";
    let mut mounts = vec![
        json!({"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"}),
        json!({"name": "credential-socket", "mountPath": "/var/run/secrets/credential-uds"}),
        json!({"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"}),
    ];
    if istiod_ca {
        mounts.push(json!({"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"}));
    }
    mounts.extend([
        json!({"name": "istio-data", "mountPath": "/var/lib/istio/data"}),
        json!({"name": "istio-envoy", "mountPath": "/etc/istio/proxy"}),
        json!({"name": "istio-token", "mountPath": "/var/run/secrets/tokens"}),
        json!({"name": "istio-podinfo", "mountPath": "/etc/istio/pod"}),
    ]);
    let mut volumes = vec![
        json!({"name": "workload-socket", "emptyDir": {}}),
        json!({"name": "credential-socket", "emptyDir": {}}),
        json!({"name": "workload-certs", "emptyDir": {}}),
        json!({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}}),
        json!({"name": "istio-data", "emptyDir": {}}),
        json!({"name": "istio-podinfo", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        ]}}),
        json!({"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
            "path": "istio-token",
            "expirationSeconds": 43200,
            "audience": t.token_audience,
        }}]}}),
    ];
    if istiod_ca {
        volumes
            .push(json!({"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}}));
    }
    let mut container = json!({
        "name": "istio-proxy",
        "image": t.image,
        "args": [
            "proxy", "router",
            "--domain", format!("$(POD_NAMESPACE).svc.{}", t.cluster_domain),
            "--proxyLogLevel", t.proxy_log_level,
            "--proxyComponentLogLevel", t.component_log_level,
            "--log_output_level", t.agent_log_level,
        ],
        "env": env,
        "ports": [
            {"containerPort": 15020, "name": "metrics", "protocol": "TCP"},
            {"containerPort": STATUS_PORT, "name": "status-port", "protocol": "TCP"},
            {"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"},
        ],
        "securityContext": {
            "capabilities": {"drop": ["ALL"]},
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "runAsUser": 1337,
            "runAsGroup": 1337,
            "runAsNonRoot": true,
        },
        "startupProbe": {
            "httpGet": ready,
            "initialDelaySeconds": 1,
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 30,
        },
        "readinessProbe": {
            "httpGet": ready,
            "initialDelaySeconds": 0,
            "periodSeconds": 15,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 4,
        },
        "volumeMounts": mounts,
    });
    if let Some(policy) = &t.image_pull_policy {
        container["imagePullPolicy"] = json!(policy);
    }
    if let Some(resources) = &t.resources {
        container["resources"] = resources.clone();
    }
    json!({
        "securityContext": {
            "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
        },
        "serviceAccountName": name,
        "containers": [container],
        "volumes": volumes,
    })
}

/// The proxy template: from the injector's ConfigMap, else ISTIO_RS_PROXY_IMAGE.
async fn proxy_template(client: &kube::Client, s: &Settings) -> Result<ProxyTemplate, DeployError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &s.istio_namespace);
    let what = format!(
        "get ConfigMap {}/{}",
        s.istio_namespace, s.injector_config_map
    );
    let values_error = |reason: String| DeployError::Values {
        namespace: s.istio_namespace.clone(),
        config_map: s.injector_config_map.clone(),
        reason,
    };
    match api
        .get_opt(&s.injector_config_map)
        .await
        .map_err(api_error(what))?
    {
        Some(cm) => {
            let text = cm
                .data
                .and_then(|mut d| d.remove("values"))
                .ok_or_else(|| values_error("missing".into()))?;
            let values: Value =
                serde_json::from_str(&text).map_err(|e| values_error(format!("not JSON: {e}")))?;
            ProxyTemplate::from_values(&values, s).map_err(|e| values_error(e.to_string()))
        }
        None => match &s.fallback_image {
            Some(image) => Ok(ProxyTemplate::from_image(image, s)),
            None => Err(DeployError::NoImage {
                namespace: s.istio_namespace.clone(),
                config_map: s.injector_config_map.clone(),
                env: crate::config::env::ISTIO_RS_PROXY_IMAGE,
            }),
        },
    }
}

fn gateway_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: GATEWAY_API_VERSION.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Creates the GatewayClass `istio` when the Gateway API is installed and it does not exist
/// (istiod's class controller; an existing one is left as it is).
pub async fn ensure_class(client: &kube::Client) -> Result<(), DeployError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds
        .get_opt(GATEWAY_CLASS_CRD)
        .await
        .map_err(api_error(format!(
            "get CustomResourceDefinition {GATEWAY_CLASS_CRD}"
        )))?
        .is_none()
    {
        return Ok(());
    }
    let classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &gateway_resource("GatewayClass", "gatewayclasses"),
    );
    let what = format!("GatewayClass {DEFAULT_CLASS}");
    if classes
        .get_opt(DEFAULT_CLASS)
        .await
        .map_err(api_error(format!("get {what}")))?
        .is_some()
    {
        return Ok(());
    }
    let class = json!({
        "apiVersion": GATEWAY_API_VERSION,
        "kind": "GatewayClass",
        "metadata": {"name": DEFAULT_CLASS},
        "spec": {
            "controllerName": CONTROLLER,
            "description": "The default Istio GatewayClass",
        },
    });
    classes
        .patch(
            DEFAULT_CLASS,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&class),
        )
        .await
        .map_err(api_error(format!("apply {what}")))?;
    tracing::info!(
        class = DEFAULT_CLASS,
        controller = CONTROLLER,
        "created the GatewayClass"
    );
    Ok(())
}

/// Applies the objects of the Gateway `namespace/name`; `Ok(false)` when the Gateway is gone.
async fn deploy(
    client: &kube::Client,
    meta: &Metadata,
    spec: &GatewaySpec,
    t: &ProxyTemplate,
) -> Result<bool, DeployError> {
    let namespace = meta.namespace();
    let name = meta.name.as_str();
    let gateways: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &gateway_resource("Gateway", "gateways"),
    );
    let Some(gateway) = gateways
        .get_opt(name)
        .await
        .map_err(api_error(format!("get Gateway {namespace}/{name}")))?
    else {
        return Ok(false);
    };
    let Some(uid) = gateway.metadata.uid.as_deref() else {
        return Ok(false);
    };
    let gw = GatewayRef {
        namespace,
        name,
        uid,
        spec,
    };
    let rendered = render(&gw, t);
    let object = gw.deployment_name();
    let params = PatchParams::apply(MANAGER).force();
    let what = |kind: &str| format!("apply {kind} {namespace}/{object}");
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .patch(&object, &params, &Patch::Apply(&rendered.service_account))
        .await
        .map_err(api_error(what("ServiceAccount")))?;
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .patch(&object, &params, &Patch::Apply(&rendered.deployment))
        .await
        .map_err(api_error(what("Deployment")))?;
    Api::<Service>::namespaced(client.clone(), namespace)
        .patch(&object, &params, &Patch::Apply(&rendered.service))
        .await
        .map_err(api_error(what("Service")))?;
    Ok(true)
}

/// What a Gateway was last deployed from: a change of either applies it again.
type Applied = BTreeMap<(String, String), (GatewaySpec, ProxyTemplate)>;

/// One pass over the served Gateways: applies those not yet applied as they are now. Returns
/// whether everything went through.
async fn reconcile(
    client: &kube::Client,
    source: &KubeSource,
    s: &Settings,
    applied: &mut Applied,
) -> bool {
    let resources = match source.list() {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the Kubernetes config for Gateway deployments");
            return false;
        }
    };
    let gateways: Vec<(&Metadata, &GatewaySpec)> = served_gateways(&resources)
        .into_iter()
        .filter(|(_, spec)| is_managed(spec))
        .collect();
    let key = |m: &Metadata| (m.namespace().to_string(), m.name.clone());
    let present: std::collections::BTreeSet<_> = gateways.iter().map(|(m, _)| key(m)).collect();
    applied.retain(|k, _| present.contains(k));
    let pending: Vec<_> = gateways
        .into_iter()
        .filter(|(m, spec)| applied.get(&key(m)).is_none_or(|(was, _)| was != *spec))
        .collect();
    if pending.is_empty() {
        return true;
    }
    let template = match proxy_template(client, s).await {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot deploy Gateways");
            return false;
        }
    };
    let mut ok = true;
    for (meta, spec) in pending {
        let k = key(meta);
        match deploy(client, meta, spec, &template).await {
            Ok(true) => {
                tracing::info!(
                    gateway = %format!("{}/{}", k.0, k.1),
                    image = %template.image,
                    "deployed the Gateway (ServiceAccount, Deployment, Service {}-{})",
                    k.1,
                    spec.gateway_class_name
                );
                applied.insert(k, (spec.clone(), template.clone()));
            }
            // Deleted since it was listed: the next listing will not have it.
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(gateway = %format!("{}/{}", k.0, k.1), error = %e, "cannot deploy the Gateway; retrying");
                ok = false;
            }
        }
    }
    ok
}

/// Deploys the served Gateways on every config change and every `RESYNC`, retrying failures
/// with backoff; runs until the process ends.
pub async fn run(client: kube::Client, source: Arc<KubeSource>, settings: Settings) {
    let mut changes = source.subscribe();
    let mut applied = Applied::new();
    let mut next_resync = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(500);
    loop {
        let now = tokio::time::Instant::now();
        let mut ok = true;
        if now >= next_resync {
            applied.clear();
            next_resync = now + RESYNC;
            if let Err(e) = ensure_class(&client).await {
                tracing::warn!(error = %e, "cannot create the GatewayClass {DEFAULT_CLASS}; retrying");
                ok = false;
                next_resync = now;
            }
        }
        changes.mark_unchanged();
        ok &= reconcile(&client, &source, &settings, &mut applied).await;
        let wait = if ok {
            backoff = Duration::from_millis(500);
            next_resync.saturating_duration_since(tokio::time::Instant::now())
        } else {
            let wait = backoff;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            wait
        };
        tokio::select! {
            changed = changes.changed() => {
                // The source outlives this task; should its sender go, fall back to the resync.
                if changed.is_err() {
                    tokio::time::sleep(wait).await;
                }
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config_store::gateway_api::{GatewayAddress, Listener};

    fn settings() -> Settings {
        Settings {
            istio_namespace: "istio-system".into(),
            injector_config_map: "istio-sidecar-injector".into(),
            fallback_image: None,
            trust_domain: "cluster.local".into(),
            domain_suffix: "cluster.local".into(),
        }
    }

    fn listener(name: &str, port: u16, protocol: &str) -> Listener {
        Listener {
            name: name.into(),
            port,
            protocol: protocol.into(),
            ..Listener::default()
        }
    }

    fn spec() -> GatewaySpec {
        GatewaySpec {
            gateway_class_name: "istio".into(),
            listeners: vec![
                listener("http", 80, "HTTP"),
                listener("other-http", 80, "HTTP"),
                listener("https", 443, "HTTPS"),
                listener("tcp", 9000, "TCP"),
            ],
            addresses: Vec::new(),
            infrastructure: None,
        }
    }

    /// The values of the injector ConfigMap as `istioctl` renders them (the part read).
    fn values() -> Value {
        json!({
            "global": {
                "hub": "localhost/istio-rs",
                "tag": "test",
                "proxy": {
                    "image": "proxyv2",
                    "clusterDomain": "cluster.local",
                    "logLevel": "warning",
                    "componentLogLevel": "misc:error",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "2", "memory": "1Gi"},
                    },
                },
                "logging": {"level": "default:info"},
                "pilotCertProvider": "istiod",
                "istioNamespace": "istio-system",
                "caAddress": "",
                "imagePullPolicy": "",
                "multiCluster": {"clusterName": ""},
                "meshID": "",
                "sds": {"token": {"aud": "istio-ca"}},
            },
            "revision": "",
        })
    }

    fn rendered(spec: &GatewaySpec) -> Rendered {
        let t = ProxyTemplate::from_values(&values(), &settings()).unwrap();
        render(
            &GatewayRef {
                namespace: "default",
                name: "bookinfo-gateway",
                uid: "0b1c-uid",
                spec,
            },
            &t,
        )
    }

    #[test]
    fn the_image_is_hub_image_tag_from_the_values() {
        let t = ProxyTemplate::from_values(&values(), &settings()).unwrap();
        assert_eq!(t.image, "localhost/istio-rs/proxyv2:test");
        assert_eq!(t.ca_address, "istiod.istio-system.svc:15012");
        assert_eq!(t.cluster_id, "Kubernetes");
        assert_eq!(t.mesh_id, "cluster.local");
        assert_eq!(t.revision, "default");
        assert_eq!(t.image_pull_policy, None);
        // A numeric tag, a revision, and an image that names its registry.
        let mut v = values();
        v["global"]["tag"] = json!(1.29);
        v["revision"] = json!("canary");
        let t = ProxyTemplate::from_values(&v, &settings()).unwrap();
        assert_eq!(t.image, "localhost/istio-rs/proxyv2:1.29");
        assert_eq!(t.ca_address, "istiod-canary.istio-system.svc:15012");
        v["global"]["proxy"]["image"] = json!("registry.example/custom:7");
        let t = ProxyTemplate::from_values(&v, &settings()).unwrap();
        assert_eq!(t.image, "registry.example/custom:7");
        // No hub: an error that says which value is missing.
        let mut v = values();
        v["global"].as_object_mut().unwrap().remove("hub");
        let err = ProxyTemplate::from_values(&v, &settings()).unwrap_err();
        assert!(err.contains("global.hub"), "{err}");
    }

    #[test]
    fn every_object_is_owned_by_the_gateway_and_labelled() {
        let r = rendered(&spec());
        let owner = json!([{
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "name": "bookinfo-gateway",
            "uid": "0b1c-uid",
            "controller": true,
        }]);
        for (kind, o) in [
            ("ServiceAccount", &r.service_account),
            ("Deployment", &r.deployment),
            ("Service", &r.service),
        ] {
            assert_eq!(o["kind"], kind);
            assert_eq!(o["metadata"]["name"], "bookinfo-gateway-istio");
            assert_eq!(o["metadata"]["namespace"], "default");
            assert_eq!(o["metadata"]["ownerReferences"], owner, "{kind}");
            assert_eq!(
                o["metadata"]["labels"][GATEWAY_NAME_LABEL],
                "bookinfo-gateway"
            );
            assert_eq!(o["metadata"]["labels"][CLASS_LABEL], "istio");
        }
        assert_eq!(
            r.deployment["metadata"]["labels"][MANAGED_LABEL],
            MANAGED_VALUE
        );
    }

    #[test]
    fn the_service_has_a_port_per_listener_port_and_the_status_port() {
        let r = rendered(&spec());
        let svc = &r.service["spec"];
        assert_eq!(svc["type"], "LoadBalancer");
        assert_eq!(
            svc["selector"],
            json!({GATEWAY_NAME_LABEL: "bookinfo-gateway"})
        );
        let ports: Vec<(String, u64, String)> = svc["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["port"].as_u64().unwrap(),
                    p["appProtocol"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                ("status-port".to_string(), 15021, "tcp".to_string()),
                ("http-80".to_string(), 80, "http".to_string()),
                ("https-443".to_string(), 443, "https".to_string()),
                ("tcp-9000".to_string(), 9000, "tcp".to_string()),
            ]
        );
        assert!(svc.get("loadBalancerIP").is_none());
        // One IP address is the load balancer's; a hostname is an existing Service.
        let mut with_ip = spec();
        with_ip.addresses = vec![GatewayAddress {
            type_: Some("IPAddress".into()),
            value: Some("10.244.0.200".into()),
        }];
        assert!(is_managed(&with_ip));
        assert_eq!(
            rendered(&with_ip).service["spec"]["loadBalancerIP"],
            "10.244.0.200"
        );
        let mut hostname = spec();
        hostname.addresses = vec![GatewayAddress {
            type_: Some("Hostname".into()),
            value: Some("ingress.istio-system.svc.cluster.local".into()),
        }];
        assert!(!is_managed(&hostname));
    }

    #[test]
    fn infrastructure_labels_and_annotations_go_on_every_object_and_the_pods() {
        let mut s = spec();
        s.infrastructure = Some(crate::config_store::gateway_api::GatewayInfrastructure {
            labels: BTreeMap::from([
                ("key2".to_string(), "value2".to_string()),
                // The controller's own label wins.
                (GATEWAY_NAME_LABEL.to_string(), "not-this".to_string()),
            ]),
            annotations: BTreeMap::from([("key1".to_string(), "value1".to_string())]),
            parameters_ref: None,
        });
        let r = rendered(&s);
        let pod = &r.deployment["spec"]["template"]["metadata"];
        for meta in [
            &r.service_account["metadata"],
            &r.deployment["metadata"],
            &r.service["metadata"],
            pod,
        ] {
            assert_eq!(meta["labels"]["key2"], "value2", "{meta}");
            assert_eq!(meta["labels"][GATEWAY_NAME_LABEL], "bookinfo-gateway");
            assert_eq!(meta["annotations"]["key1"], "value1", "{meta}");
        }
        assert_eq!(pod["annotations"]["prometheus.io/port"], "15020");
    }

    #[test]
    fn the_pod_template_is_complete_as_istio_renders_it() {
        let r = rendered(&spec());
        let template = &r.deployment["spec"]["template"];
        assert_eq!(
            r.deployment["spec"]["selector"]["matchLabels"],
            json!({GATEWAY_NAME_LABEL: "bookinfo-gateway"})
        );
        let labels = &template["metadata"]["labels"];
        assert_eq!(labels["sidecar.istio.io/inject"], "false");
        assert_eq!(
            labels["service.istio.io/canonical-name"],
            "bookinfo-gateway-istio"
        );
        assert_eq!(labels[GATEWAY_NAME_LABEL], "bookinfo-gateway");
        assert_eq!(labels[MANAGED_LABEL], MANAGED_VALUE);
        assert_eq!(
            template["metadata"]["annotations"]["istio.io/rev"],
            "default"
        );
        let pod = &template["spec"];
        assert_eq!(pod["serviceAccountName"], "bookinfo-gateway-istio");
        assert_eq!(
            pod["securityContext"]["sysctls"],
            json!([{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}])
        );
        let c = &pod["containers"][0];
        assert_eq!(c["name"], "istio-proxy");
        assert_eq!(c["image"], "localhost/istio-rs/proxyv2:test");
        assert_eq!(
            c["args"],
            json!([
                "proxy",
                "router",
                "--domain",
                "$(POD_NAMESPACE).svc.cluster.local",
                "--proxyLogLevel",
                "warning",
                "--proxyComponentLogLevel",
                "misc:error",
                "--log_output_level",
                "default:info",
            ])
        );
        assert_eq!(c["securityContext"]["runAsUser"], 1337);
        assert_eq!(c["readinessProbe"]["httpGet"]["port"], 15021);
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/healthz/ready");
        assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
        let env: BTreeMap<&str, &Value> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e))
            .collect();
        assert_eq!(env["CA_ADDR"]["value"], "istiod.istio-system.svc:15012");
        assert_eq!(
            env["ISTIO_META_OWNER"]["value"],
            "kubernetes://apis/apps/v1/namespaces/default/deployments/bookinfo-gateway-istio"
        );
        assert_eq!(
            env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        // Every mount has its volume; the token is for the CA, the root from its ConfigMap.
        let volumes: BTreeMap<&str, &Value> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["name"].as_str().unwrap(), v))
            .collect();
        for m in c["volumeMounts"].as_array().unwrap() {
            assert!(volumes.contains_key(m["name"].as_str().unwrap()), "{m}");
        }
        assert_eq!(
            volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]["audience"],
            "istio-ca"
        );
        assert_eq!(
            volumes["istiod-ca-cert"]["configMap"]["name"],
            "istio-ca-root-cert"
        );
        assert_eq!(
            volumes["istio-podinfo"]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            "metadata.labels"
        );
    }

    #[test]
    fn the_fallback_image_takes_istios_defaults() {
        let t = ProxyTemplate::from_image("registry.example/proxyv2:1.0", &settings());
        assert_eq!(t.image, "registry.example/proxyv2:1.0");
        assert_eq!(t.proxy_log_level, "warning");
        assert_eq!(t.token_audience, "istio-ca");
        assert_eq!(t.resources, None);
    }
}
