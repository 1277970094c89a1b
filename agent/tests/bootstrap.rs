//! Bootstrap goldens, each also checked by Envoy itself (`envoy --mode validate`).
//! Regenerate with `UPDATE_GOLDENS=1 cargo test -p pilot-agent --test bootstrap`.

mod support;

use std::path::Path;

use pilot_agent::bootstrap;
use pilot_agent::config::{Config, ProxyArgs};

/// Bootstrap goldens' pods live in namespace `shop`.
const DOMAIN: &str = "shop.svc.cluster.local";

fn config(env: &[(&str, &str)]) -> Config {
    config_with(env, ProxyArgs::default())
}

fn config_with(env: &[(&str, &str)], extra: ProxyArgs) -> Config {
    support::sidecar_config(DOMAIN, env, extra)
}

fn cases() -> Vec<(&'static str, Config)> {
    let base = [
        ("POD_NAME", "web-6d4cf56db6-x2x7k"),
        ("POD_NAMESPACE", "shop"),
        ("INSTANCE_IP", "10.1.2.3"),
        ("SERVICE_ACCOUNT", "web"),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ("ISTIO_META_MESH_ID", "cluster.local"),
    ];
    let mut sotw = base.to_vec();
    sotw.push(("ISTIO_DELTA_XDS", "false"));
    let mut hostile = base.to_vec();
    hostile[0] = (
        "POD_NAME",
        "x\",\"admin\":{\"address\":{}},\"y\":\"{{ .Evil }}\n",
    );
    hostile.push(("ISTIO_META_INJECT", "}\"]}{\\"));
    hostile.push(("ISTIO_METAJSON_EXTRA", "{\"k\": [1, \"}\"]}"));
    // A custom template fragment and topology labels, from files as the injector mounts them.
    let dir = std::env::temp_dir().join(format!("bootstrap-custom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("labels"),
        "topology.kubernetes.io/region=\"eu\"\ntopology.kubernetes.io/zone=\"eu-1a\"\n",
    )
    .expect("labels");
    std::fs::write(
        dir.join("tpl.yaml"),
        "stats_config:\n  use_all_default_tags: false\n",
    )
    .expect("tpl");
    let custom = config_with(
        &base,
        ProxyArgs {
            pod_info_dir: Some(dir.clone()),
            template_file: Some(dir.join("tpl.yaml")),
            ..Default::default()
        },
    );
    let _ = std::fs::remove_dir_all(&dir);
    // Istio 1.5's injector flags: the Zipkin tracer and cluster, connectTimeout on xds-grpc.
    let istio_1_5 = config_with(
        &base,
        ProxyArgs {
            legacy: pilot_agent::config::legacy_flags::LegacyFlags {
                zipkin_address: Some("zipkin.istio-system:9411".into()),
                connect_timeout: Some("10s".into()),
                dns_refresh_rate: Some("300s".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let mut dual = base.to_vec();
    dual[2] = ("INSTANCE_IP", "fd00:1::3,10.1.2.3");
    vec![
        ("default", config(&base)),
        ("ipv6", config(&dual)),
        ("custom-template", custom),
        ("sotw", config(&sotw)),
        ("hostile", config(&hostile)),
        ("istio-1.5-flags", istio_1_5),
    ]
}

#[test]
fn bootstraps_match_goldens_and_envoy_accepts_them() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDENS").is_some();
    let tmp = std::env::temp_dir().join(format!("bootstrap-golden-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp dir");
    let envoy = support::envoy();
    let mut failures = Vec::new();
    for (name, cfg) in cases() {
        let text = serde_json::to_string_pretty(&bootstrap::render(&cfg)).expect("json") + "\n";
        let path = dir.join(format!("bootstrap-{name}.json"));
        if update {
            std::fs::write(&path, &text).expect("write golden");
        } else if std::fs::read_to_string(&path).unwrap_or_default() != text {
            failures.push(format!("{name}: differs from {}", path.display()));
        }
        if let Some(envoy) = &envoy {
            let file = tmp.join(format!("{name}.json"));
            std::fs::write(&file, &text).expect("write bootstrap");
            let out = std::process::Command::new(envoy)
                .args(["--mode", "validate", "-c"])
                .arg(&file)
                .output()
                .expect("run envoy");
            if !out.status.success() {
                failures.push(format!(
                    "{name}: envoy --mode validate failed: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
