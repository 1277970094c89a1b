//! What the proxy module reads of a cluster (`mesh_common::module::cluster`), from what istiod
//! writes: Istio's filters read the service a cluster reaches from the list
//! `filter_metadata.istio.services` and the HTTP protocol it speaks upstream from the cluster
//! itself, neither of which a module's metadata getters reach (they read strings of one
//! namespace). So each cluster gets them as strings under `istio_module`: the first service
//! (`service`, `HOST;NAME;NAMESPACE`) and `upstream_protocol` (`HTTP2`, or `downstream` for a
//! cluster that speaks the downstream's protocol; nothing for HTTP/1.1, the default). Only a
//! cluster with istiod's `istio.services` gets them: the module's `istio.alpn` leaves a cluster
//! without them its own ALPN (istiod-core's clusters carry the ALPN of their protocol in their
//! TLS context, and their names tell the service). istiod's `istio` namespace is never changed,
//! and a cluster that has `istio_module` already is left as it is.

use mesh_common::module::cluster::{self, NAMESPACE, SERVICE, UPSTREAM_PROTOCOL, name_of};

use super::{WireError, wire};

/// The key of `Cluster.typed_extension_protocol_options` for HTTP.
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
/// The filter_metadata namespace istiod writes.
const ISTIO: &str = "istio";

/// The `filter_metadata` entry (key, Struct) to add to `cluster` (a Cluster message), or `None`
/// when nothing applies or it has one already.
pub fn entry(cluster: &[u8]) -> Result<Option<Vec<u8>>, WireError> {
    let mut istio = None;
    // Cluster.metadata (25) → Metadata.filter_metadata (1): map entries, key 1, Struct 2.
    for metadata in wire::repeated(cluster, 25)? {
        for e in wire::repeated(metadata, 1)? {
            match wire::string_field(e, 1)? {
                NAMESPACE => return Ok(None),
                ISTIO => istio = wire::len_field(e, 2)?,
                _ => {}
            }
        }
    }
    let service = match istio {
        Some(s) => first_service(s)?,
        None => None,
    };
    if service.is_none() {
        return Ok(None);
    }
    let protocol = upstream_protocol(cluster)?;
    let mut fields: Vec<(&str, String)> = Vec::new();
    if let Some(s) = &service {
        // A service istiod names without a name or namespace: what its host tells.
        let (name, namespace) = name_of(&s.host);
        let or = |given: &str, told: &str| -> String {
            if given.is_empty() { told } else { given }.to_string()
        };
        fields.push((
            SERVICE,
            cluster::service(&s.host, &or(&s.name, name), &or(&s.namespace, namespace)),
        ));
    }
    if let Some(p) = protocol {
        fields.push((UPSTREAM_PROTOCOL, p.to_string()));
    }
    let mut entry = Vec::new();
    wire::put_len(&mut entry, 1, NAMESPACE.as_bytes());
    wire::put_len(&mut entry, 2, &string_struct(&fields));
    Ok(Some(entry))
}

/// `istio.services[0]`.
struct Service {
    host: String,
    name: String,
    namespace: String,
}

/// The first entry of a Struct's `services` list, when it names a host.
fn first_service(istio: &[u8]) -> Result<Option<Service>, WireError> {
    // Value.list_value (6) → ListValue.values (1) → Value.struct_value (5).
    let Some(services) = struct_field(istio, "services")? else {
        return Ok(None);
    };
    let Some(list) = wire::len_field(services, 6)? else {
        return Ok(None);
    };
    let Some(first) = wire::repeated(list, 1)?.into_iter().next() else {
        return Ok(None);
    };
    let Some(service) = wire::len_field(first, 5)? else {
        return Ok(None);
    };
    let text = |key: &str| -> Result<String, WireError> {
        // Value.string_value (3).
        Ok(match struct_field(service, key)? {
            Some(v) => wire::string_field(v, 3)?.to_string(),
            None => String::new(),
        })
    };
    let host = text("host")?;
    if host.is_empty() {
        return Ok(None);
    }
    Ok(Some(Service {
        host,
        name: text("name")?,
        namespace: text("namespace")?,
    }))
}

/// The Value of `key` in a Struct (fields 1: map entries, key 1, Value 2), the last one if
/// repeated.
fn struct_field<'a>(s: &'a [u8], key: &str) -> Result<Option<&'a [u8]>, WireError> {
    let mut found = None;
    for e in wire::repeated(s, 1)? {
        if wire::string_field(e, 1)? == key {
            found = wire::len_field(e, 2)?;
        }
    }
    Ok(found)
}

/// A Struct of string Values, in this order.
fn string_struct(fields: &[(&str, String)]) -> Vec<u8> {
    let mut s = Vec::new();
    for (key, value) in fields {
        let mut v = Vec::new();
        wire::put_len(&mut v, 3, value.as_bytes());
        let mut e = Vec::new();
        wire::put_len(&mut e, 1, key.as_bytes());
        wire::put_len(&mut e, 2, &v);
        wire::put_len(&mut s, 1, &e);
    }
    s
}

/// The HTTP protocol the cluster speaks upstream, as Envoy picks it (`upstreamHttpProtocol`,
/// the first of its list, which is what Istio's `istio.alpn` reads): from the cluster's
/// HttpProtocolOptions when it has them (`explicit_http_config` 3 with `http2_protocol_options`
/// 2: HTTP/2; `use_downstream_protocol_config` 4: the downstream's; `auto_config` 5: HTTP/2
/// first, ALPN deciding), else from the deprecated fields (`protocol_selection` 26
/// USE_DOWNSTREAM_PROTOCOL, `http2_protocol_options` 14). `None`: HTTP/1.1.
fn upstream_protocol(cluster: &[u8]) -> Result<Option<&'static str>, WireError> {
    let mut options = None;
    // typed_extension_protocol_options (36): map entries, key 1, Any 2 (its value 2).
    for e in wire::repeated(cluster, 36)? {
        if wire::string_field(e, 1)? == HTTP_PROTOCOL_OPTIONS {
            let any = wire::len_field(e, 2)?.unwrap_or_default();
            options = Some(wire::len_field(any, 2)?.unwrap_or_default());
        }
    }
    if let Some(options) = options {
        let mut protocol = None;
        for f in wire::fields(options) {
            let f = f?;
            if !f.is_len() {
                continue;
            }
            protocol = match f.number {
                3 => {
                    // ExplicitHttpConfig: http_protocol_options 1, http2 2, http3 3 (a oneof).
                    let mut explicit = None;
                    for p in wire::fields(f.value) {
                        let p = p?;
                        if p.is_len() && (1..=3).contains(&p.number) {
                            explicit = (p.number == 2).then_some("HTTP2");
                        }
                    }
                    explicit
                }
                4 => Some("downstream"),
                5 => Some("HTTP2"),
                _ => continue,
            };
        }
        return Ok(protocol);
    }
    if wire::varint_field(cluster, 26)? == Some(1) {
        return Ok(Some("downstream"));
    }
    Ok(wire::len_field(cluster, 14)?.map(|_| "HTTP2"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::{Http2ProtocolOptions, Metadata};
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
        HttpProtocolOptions, http_protocol_options,
    };
    use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
    use envoy_types::util::pack_any;
    use prost::Message;

    fn s(v: &str) -> Value {
        Value {
            kind: Some(Kind::StringValue(v.into())),
        }
    }

    fn object(fields: &[(&str, Value)]) -> Struct {
        Struct {
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// istiod's `istio` metadata naming `services`.
    fn istio(services: &[(&str, &str, &str)]) -> Metadata {
        let list = services
            .iter()
            .map(|(host, name, namespace)| {
                let mut fields = vec![("host", s(host)), ("namespace", s(namespace))];
                if !name.is_empty() {
                    fields.push(("name", s(name)));
                }
                Value {
                    kind: Some(Kind::StructValue(object(&fields))),
                }
            })
            .collect();
        let services = Value {
            kind: Some(Kind::ListValue(ListValue { values: list })),
        };
        Metadata {
            filter_metadata: [(
                "istio".to_string(),
                object(&[("services", services), ("subset", s("v1"))]),
            )]
            .into(),
            ..Default::default()
        }
    }

    /// The entry added, decoded: (key, field → string).
    fn added(c: &Cluster) -> Option<Vec<(String, String)>> {
        let e = entry(&c.encode_to_vec()).unwrap()?;
        let mut m = Vec::new();
        wire::put_len(&mut m, 1, &e);
        let md = Metadata::decode(m.as_slice()).unwrap();
        let st = &md.filter_metadata[NAMESPACE];
        let mut out: Vec<(String, String)> = st
            .fields
            .iter()
            .map(|(k, v)| match &v.kind {
                Some(Kind::StringValue(s)) => (k.clone(), s.clone()),
                other => panic!("{k}: {other:?}"),
            })
            .collect();
        out.sort();
        Some(out)
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<_> = p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        v.sort();
        v
    }

    fn http_options(o: http_protocol_options::UpstreamProtocolOptions) -> Cluster {
        Cluster {
            typed_extension_protocol_options: [(
                HTTP_PROTOCOL_OPTIONS.to_string(),
                pack_any(HttpProtocolOptions {
                    upstream_protocol_options: Some(o),
                    ..Default::default()
                }),
            )]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_first_service_and_the_protocol() {
        let mut c = http_options(
            http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(
                        http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                            Http2ProtocolOptions::default(),
                        ),
                    ),
                },
            ),
        );
        c.metadata = Some(istio(&[
            (
                "istiod.istio-system.svc.cluster.local",
                "istiod",
                "istio-system",
            ),
            ("other.ns.svc.cluster.local", "other", "ns"),
        ]));
        assert_eq!(
            added(&c).unwrap(),
            pairs(&[
                (
                    SERVICE,
                    "istiod.istio-system.svc.cluster.local;istiod;istio-system"
                ),
                (UPSTREAM_PROTOCOL, "HTTP2"),
            ])
        );
        // No name: what the host tells. No protocol options: nothing said (HTTP/1.1).
        let c = Cluster {
            metadata: Some(istio(&[(
                "reviews.default.svc.cluster.local",
                "",
                "default",
            )])),
            ..Default::default()
        };
        assert_eq!(
            added(&c).unwrap(),
            pairs(&[(SERVICE, "reviews.default.svc.cluster.local;reviews;default")])
        );
        let c = Cluster {
            metadata: Some(istio(&[("api.example.com", "", "")])),
            ..Default::default()
        };
        assert_eq!(
            added(&c).unwrap(),
            pairs(&[(SERVICE, "api.example.com;api.example.com;")])
        );
    }

    #[test]
    fn the_protocol_of_a_cluster_with_services_and_nothing_without() {
        let svc = || istio(&[("a.ns.svc.cluster.local", "a", "ns")]);
        let a = || (SERVICE, "a.ns.svc.cluster.local;a;ns");
        let mut c = http_options(
            http_protocol_options::UpstreamProtocolOptions::UseDownstreamProtocolConfig(
                Default::default(),
            ),
        );
        // Without istiod's services: nothing (the module leaves such a cluster its own ALPN).
        assert_eq!(added(&c), None);
        c.metadata = Some(svc());
        assert_eq!(
            added(&c).unwrap(),
            pairs(&[a(), (UPSTREAM_PROTOCOL, "downstream")])
        );
        let mut c = http_options(
            http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(
                        http_protocol_options::explicit_http_config::ProtocolConfig::HttpProtocolOptions(
                            Default::default(),
                        ),
                    ),
                },
            ),
        );
        c.metadata = Some(svc());
        assert_eq!(
            added(&c).unwrap(),
            pairs(&[a()]),
            "explicit HTTP/1.1 is the default"
        );
        #[allow(deprecated)]
        let c = Cluster {
            http2_protocol_options: Some(Http2ProtocolOptions::default()),
            metadata: Some(svc()),
            ..Default::default()
        };
        assert_eq!(
            added(&c).unwrap(),
            pairs(&[a(), (UPSTREAM_PROTOCOL, "HTTP2")])
        );
        #[allow(deprecated)]
        let c = Cluster {
            protocol_selection: 1,
            metadata: Some(svc()),
            ..Default::default()
        };
        assert_eq!(
            added(&c).unwrap(),
            pairs(&[a(), (UPSTREAM_PROTOCOL, "downstream")])
        );
        assert_eq!(added(&Cluster::default()), None);
        // An empty services list or a service without a host says nothing.
        let c = Cluster {
            metadata: Some(istio(&[])),
            ..Default::default()
        };
        assert_eq!(added(&c), None);
        let c = Cluster {
            metadata: Some(istio(&[("", "x", "ns")])),
            ..Default::default()
        };
        assert_eq!(added(&c), None);
    }

    #[test]
    fn a_cluster_with_the_modules_metadata_is_left_alone() {
        let mut md = istio(&[("a.ns.svc.cluster.local", "a", "ns")]);
        md.filter_metadata
            .insert(NAMESPACE.to_string(), object(&[(SERVICE, s("mine;mine;"))]));
        let c = Cluster {
            metadata: Some(md),
            ..Default::default()
        };
        assert_eq!(entry(&c.encode_to_vec()).unwrap(), None);
    }
}
