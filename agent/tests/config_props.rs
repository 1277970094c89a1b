#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Property tests of the agent's cheap parsers (the stable-toolchain counterparts of the
//! `agent_config` and `sds_names` fuzz targets, brief enough for every test run): ProxyConfig
//! and env values and SDS resource names.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use pilot_agent::config::identity::MountedCerts;
use pilot_agent::config::{Config, ConfigError, Inputs, ProxyArgs};
use pilot_agent::identity::WorkloadCert;
use proptest::prelude::*;

fn parse(env: &[(&str, String)]) -> Result<Config, ConfigError> {
    let vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let inputs = Inputs {
        labels: None,
        annotations: None,
        mesh_config: None,
        resolv_conf: Ok(None),
        mounted_certs: MountedCerts {
            spiffe_credentials: false,
            etc_certs: false,
        },
    };
    let args = ProxyArgs {
        proxy_type: "sidecar".into(),
        config_dir: Some(PathBuf::from("/mesh")),
        ..ProxyArgs::default()
    };
    let lookup = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    Config::parse(&args, &inputs, &lookup, &vars, &|_| None)
}

/// Text that looks like a duration more often than not.
fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,20}(\\.[0-9]{0,12})?(ns|us|ms|s|m|h)",
        "[-+]?[0-9.]{0,20}[a-z]{0,3}",
        "\\PC{0,20}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A ProxyConfig duration is the Go duration it spells, or an error naming the field.
    #[test]
    fn proxy_config_durations_parse_or_name_the_field(value in duration_text()) {
        let json = serde_json::json!({ "drainDuration": value }).to_string();
        match (parse(&[("PROXY_CONFIG", json)]), mesh_common::parse_go_duration(&value)) {
            (Ok(c), Ok(d)) => prop_assert_eq!(c.drain_duration, d),
            (Err(e), Err(_)) => {
                prop_assert_eq!(e.input, "ProxyConfig.drainDuration");
                prop_assert_eq!(e.value, value);
            }
            (got, want) => prop_assert!(false, "{value:?}: config {got:?}, duration {want:?}"),
        }
    }

    /// Env values the agent reads are a config or an error naming the variable.
    #[test]
    fn env_values_parse_or_name_the_variable(
        name in prop::sample::select(vec![
            "MINIMUM_DRAIN_DURATION", "DNS_FORWARD_TIMEOUT", "SECRET_TTL", "INSTANCE_IP",
            "ISTIO_DELTA_XDS", "ISTIO_CPU_LIMIT", "SECRET_GRACE_PERIOD_RATIO",
            "ISTIO_KUBE_APP_PROBERS", "ISTIO_META_DNS_CAPTURE", "DNS_FORWARD_PARALLEL",
            "PILOT_DEBOUNCE_AFTER", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS",
        ]),
        value in duration_text(),
    ) {
        let env = [("ISTIO_META_DNS_CAPTURE", "true".to_string()), (name, value.clone())];
        let env = if name == "ISTIO_META_DNS_CAPTURE" { &env[1..] } else { &env[..] };
        if let Err(e) = parse(env) {
            prop_assert!(
                e.input.contains(name) || e.value == value,
                "{name}={value:?}: the error names neither: {e}"
            );
        }
    }

    /// ProxyConfig as any JSON object of strings and numbers never panics the parse.
    #[test]
    fn any_proxy_config_object_is_a_config_or_an_error(
        fields in prop::collection::btree_map(
            prop::sample::select(vec![
                "drainDuration", "terminationDrainDuration", "concurrency", "statusPort",
                "proxyAdminPort", "discoveryAddress", "proxyMetadata", "holdApplicationUntilProxyStarts",
            ]),
            prop_oneof![
                duration_text().prop_map(serde_json::Value::from),
                any::<i64>().prop_map(serde_json::Value::from),
                any::<bool>().prop_map(serde_json::Value::from),
            ],
            0..5,
        )
    ) {
        let json = serde_json::to_string(&fields).unwrap();
        if let Err(e) = parse(&[("PROXY_CONFIG", json)]) {
            prop_assert!(!e.input.is_empty());
        }
    }
}

/// A path to a file inside the allowed directory or out of it, directly or by `..` or a symlink.
fn file_path() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec![
            "ALLOWED/",
            "OUTSIDE/",
            "ALLOWED/escape/",
            "ALLOWED/../outside/",
            "ALLOWED/./",
            "",
        ]),
        prop::sample::select(vec!["f", "missing", ""]),
    )
        .prop_map(|(d, f)| format!("{d}{f}"))
}

fn cert() -> tokio::sync::watch::Receiver<Option<Arc<WorkloadCert>>> {
    let (tx, rx) = tokio::sync::watch::channel(Some(Arc::new(WorkloadCert {
        chain_pem: "chain".into(),
        key_pem: "key".into(),
        root_pem: "root".into(),
        not_before: SystemTime::UNIX_EPOCH,
        not_after: SystemTime::UNIX_EPOCH,
        serial: "1".into(),
    })));
    std::mem::forget(tx);
    rx
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever names Envoy asks for, a file outside the allowed directory is never served, and
    /// every name is answered or refused.
    #[test]
    fn sds_serves_no_file_outside_the_allowed_directory(
        names in prop::collection::vec(
            prop_oneof![
                Just("default".to_string()),
                Just("ROOTCA".to_string()),
                Just("file-root:system".to_string()),
                file_path().prop_map(|p| format!("file-root:{p}")),
                (file_path(), file_path()).prop_map(|(c, k)| format!("file-cert:{c}~{k}")),
                "(file-cert:|file-root:)?\\PC{0,12}",
            ],
            0..6,
        )
    ) {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        let outside = dir.path().join("outside");
        for d in [&allowed, &outside] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("f"), "x").unwrap();
        }
        std::os::unix::fs::symlink(&outside, allowed.join("escape")).unwrap();
        let names: Vec<String> = names
            .iter()
            .map(|n| {
                n.replace("ALLOWED", &allowed.display().to_string())
                    .replace("OUTSIDE", &outside.display().to_string())
            })
            .collect();
        let (served, refused) =
            pilot_agent::sds::secrets(&names, &cert(), std::slice::from_ref(&allowed));
        let served = served.unwrap();
        prop_assert_eq!(served.len() + refused.len(), names.len());
        let allowed = std::fs::canonicalize(&allowed).unwrap();
        for s in &served {
            let files: Vec<&str> = match (s.name.strip_prefix("file-cert:"), s.name.strip_prefix("file-root:")) {
                (Some(spec), _) => {
                    let (c, k) = spec.split_once('~').unwrap();
                    vec![c, k]
                }
                (_, Some("system")) => vec![],
                (_, Some(path)) => vec![path],
                _ => {
                    prop_assert!(s.name == "default" || s.name == "ROOTCA", "{:?}", s.name);
                    vec![]
                }
            };
            for f in files {
                let real = std::fs::canonicalize(f).unwrap();
                prop_assert!(real.starts_with(&allowed), "{:?} served {real:?}", s.name);
            }
        }
    }
}
