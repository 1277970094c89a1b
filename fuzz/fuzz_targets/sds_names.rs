//! SDS resource names (`pilot_agent::sds::secrets`, what Envoy asks the agent for): any list
//! of names is answered or refused name by name, never a panic; a `file-cert:` / `file-root:`
//! name is only ever served from inside the allowed directory (or the system roots for
//! `file-root:system`), and an unknown name is refused.
//!
//! Input: names separated by newlines. The allowed directory, `/tmp/mesh-fuzz-sds/allowed`
//! (a fixed path, so seeds can name it), holds `cert.pem`, `key.pem`, `root.pem` and a symlink
//! `escape` to the sibling directory `outside`, which holds the same files.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use libfuzzer_sys::fuzz_target;
use pilot_agent::identity::{CertWatch, WorkloadCert};
use pilot_agent::sds::{secrets, watched_files};

struct World {
    allowed: PathBuf,
    certs: [CertWatch; 2],
    _senders: Vec<tokio::sync::watch::Sender<Option<Arc<WorkloadCert>>>>,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let dir = std::path::Path::new("/tmp/mesh-fuzz-sds");
    let allowed = dir.join("allowed");
    let outside = dir.join("outside");
    for d in [&allowed, &outside] {
        std::fs::create_dir_all(d).expect("dir");
        for f in ["cert.pem", "key.pem", "root.pem"] {
            std::fs::write(d.join(f), format!("{} {f}", d.display())).expect("file");
        }
    }
    let escape = allowed.join("escape");
    if std::fs::symlink_metadata(&escape).is_err() {
        std::os::unix::fs::symlink(&outside, &escape).expect("symlink");
    }
    let cert = WorkloadCert {
        chain_pem: "chain".into(),
        key_pem: "key".into(),
        root_pem: "root".into(),
        not_before: SystemTime::UNIX_EPOCH,
        not_after: SystemTime::UNIX_EPOCH,
        serial: "1".into(),
    };
    let (none_tx, none_rx) = tokio::sync::watch::channel(None);
    let (some_tx, some_rx) = tokio::sync::watch::channel(Some(Arc::new(cert)));
    World {
        allowed: std::fs::canonicalize(allowed).expect("canonical"),
        certs: [none_rx, some_rx],
        _senders: vec![none_tx, some_tx],
    }
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let world = &*WORLD;
    let names: Vec<String> = text.split('\n').map(str::to_string).collect();
    let _ = watched_files(&names);
    let dirs = vec![world.allowed.clone()];
    for certs in &world.certs {
        let (served, refused) = secrets(&names, certs, &dirs);
        let Some(served) = served else {
            assert!(
                certs.borrow().is_none(),
                "only the missing workload cert holds the answer"
            );
            continue;
        };
        assert_eq!(
            served.len() + refused.len(),
            names.len(),
            "each name answered once"
        );
        for (name, status) in &refused {
            assert!(
                !status.message().is_empty(),
                "{name:?} refused without a reason"
            );
        }
        for secret in &served {
            let name = &secret.name;
            let files: Vec<&str> = if let Some(spec) = name.strip_prefix("file-cert:") {
                let (cert, key) = spec.split_once('~').expect("served, so well-formed");
                vec![cert, key]
            } else if let Some(path) = name.strip_prefix("file-root:") {
                if path == "system" { vec![] } else { vec![path] }
            } else {
                assert!(name == "default" || name == "ROOTCA", "{name:?} served");
                vec![]
            };
            for path in files {
                let real = std::fs::canonicalize(path).expect("a served file exists");
                assert!(
                    real.starts_with(&world.allowed),
                    "{name:?} served {real:?} from outside {:?}",
                    world.allowed
                );
            }
        }
    }
});
