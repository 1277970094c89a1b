//! The agent's configuration from its env and files (`pilot_agent::config::Config::parse` with a
//! lookup function): ProxyConfig (PROXY_CONFIG, the mesh config file, the pod annotation),
//! durations, ports, probes, metadata, identity settings. Any input is a config or an error
//! naming the input, never a panic; an accepted config renders a bootstrap.
//!
//! Input: records separated by NUL bytes, each `NAME=VALUE`. `@labels`, `@annotations` and
//! `@mesh` set the downward-API files and the mesh config file; `@remote` drops `--configDir`
//! (a remote control plane). ISTIO_BOOTSTRAP always names a small fixed fragment, so no
//! input makes the agent read an arbitrary file (it would be the operator's choice anyway).
#![no_main]

use std::path::PathBuf;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use pilot_agent::config::identity::MountedCerts;
use pilot_agent::config::{Config, Inputs, ProxyArgs};

struct World {
    template: String,
    _dir: tempfile::TempDir,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("template.yaml");
    std::fs::write(&path, "node: {cluster: fuzz}\n").expect("template");
    World {
        template: path.display().to_string(),
        _dir: dir,
    }
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let world = &*WORLD;
    let mut env: Vec<(String, String)> = Vec::new();
    let mut inputs = Inputs {
        labels: None,
        annotations: None,
        mesh_config: None,
        resolv_conf: Ok(Some(
            "nameserver 10.0.0.10\nsearch default.svc.cluster.local\n".into(),
        )),
        mounted_certs: MountedCerts {
            spiffe_credentials: false,
            etc_certs: false,
        },
    };
    let mut args = ProxyArgs {
        proxy_type: "sidecar".into(),
        config_dir: Some(PathBuf::from("/etc/istio/config")),
        ..ProxyArgs::default()
    };
    for record in text.split('\0') {
        let (name, value) = record.split_once('=').unwrap_or((record, ""));
        match name {
            "@labels" => inputs.labels = Some(value.to_string()),
            "@annotations" => inputs.annotations = Some(value.to_string()),
            "@mesh" => inputs.mesh_config = Some((PathBuf::from("mesh.yaml"), value.to_string())),
            "@remote" => args.config_dir = None,
            "ISTIO_BOOTSTRAP" | "ISTIO_BOOTSTRAP_OVERRIDE" => {}
            _ => env.push((name.to_string(), value.to_string())),
        }
    }
    env.push(("ISTIO_BOOTSTRAP".into(), world.template.clone()));
    let lookup = |k: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    match Config::parse(&args, &inputs, &lookup, &env, &|_| Some(1337)) {
        Ok(config) => {
            let _ = config.node_id();
            let _ = pilot_agent::bootstrap::render(&config);
        }
        Err(e) => {
            assert!(!e.input.is_empty(), "an error names its input: {e}");
            let _ = e.to_string();
        }
    }
});
