#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Hostile files in a live config directory: each is refused by name, the last good config
//! stays in force, the watch task survives them all, and the next good edit still arrives.
//! `istiod-core validate` reports the same files with exit 1, never a panic (exit 101).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use istiod_core::{ControlPlane, Debounce};
use mesh_common::tasks::Supervisor;

fn service(name: &str) -> String {
    format!(
        "kind: ServiceEntry\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec: {{hosts: [{name}.example], ports: [{{number: 80, name: http}}], resolution: STATIC, \
         endpoints: [{{address: 10.1.0.1}}]}}\n"
    )
}

fn vs_with(field: &str) -> String {
    format!(
        "kind: VirtualService\nmetadata: {{name: bad, namespace: shop}}\n\
         spec: {{hosts: [web.example], http: [{{{field}, route: [{{destination: {{host: web.example}}}}]}}]}}\n"
    )
}

/// (file name, contents): each must be refused without a panic.
fn hostile_files() -> Vec<(&'static str, Vec<u8>)> {
    let mut deep = "a: ".repeat(10_000);
    deep.push('1');
    let mut laughs = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let prev = (b'a' + i - 1) as char;
        let this = (b'a' + i) as char;
        laughs.push_str(&format!(
            "{this}: &{this} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
    }
    vec![
        ("overflow-timeout.yaml", vs_with("timeout: 9999999999999999h").into_bytes()),
        ("nan-timeout.yaml", vs_with("timeout: NaNs").into_bytes()),
        ("negative-timeout.yaml", vs_with("timeout: -1s").into_bytes()),
        ("number-timeout.yaml", vs_with("timeout: 1e400").into_bytes()),
        ("garbage.yaml", vec![0xff, 0xfe, 0x00, 0x01, b':', b'\n', 0x80]),
        ("deep.yaml", deep.into_bytes()),
        ("deep-flow.json", "[".repeat(100_000).into_bytes()),
        ("laughs.yaml", laughs.into_bytes()),
        (
            "huge-port.yaml",
            b"kind: ServiceEntry\nmetadata: {name: p, namespace: shop}\nspec: {hosts: [p.example], ports: [{number: 99999999999999999999, name: http}]}\n".to_vec(),
        ),
        (
            "mesh-bad.yaml",
            b"kind: MeshConfig\nmetadata: {name: m}\nspec: {trustDomain: [1, 2]}\n".to_vec(),
        ),
    ]
    .into_iter()
    .chain(regex_bombs().into_iter().map(|(name, contents, _)| (name, contents)))
    .collect()
}

/// (file name, contents, the error it must name): regexes that parse but are over RE2's
/// limits. Accepted, each would have Envoy refuse the whole route or listener configuration
/// (or, without Envoy's program-size check, take its memory).
fn regex_bombs() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let regex = |re: &str| vs_with(&format!("match: [{{uri: {{regex: '{re}'}}}}]")).into_bytes();
    vec![
        (
            "regex-100k.yaml",
            regex(&"a".repeat(100 * 1024)),
            "spec.http[0].match[0].uri: regex of 102400 bytes is longer than the 1024-byte limit",
        ),
        (
            "regex-repeat.yaml",
            regex("(a{1000}){1000}"),
            "over RE2's repetition limit",
        ),
        (
            "regex-program.yaml",
            regex(&format!("({}){{1000}}", "x".repeat(40))),
            "over Envoy's limit of 32768 (re2.max_program_size.error_level)",
        ),
        (
            "header-regex.yaml",
            vs_with("match: [{headers: {x-id: {regex: '((a{10}){10}){11}'}}}]").into_bytes(),
            "spec.http[0].match[0].headers.x-id",
        ),
        (
            "authz-namespace.yaml",
            format!(
                "kind: AuthorizationPolicy\nmetadata: {{name: big, namespace: shop}}\n\
                 spec: {{rules: [{{from: [{{source: {{namespaces: ['{}']}}}}]}}]}}\n",
                "n".repeat(100 * 1024)
            )
            .into_bytes(),
            "namespaces[0]: value of 102400 bytes is longer than the 1024-byte limit",
        ),
    ]
}

fn validate(dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_istiod-core"))
        .arg("validate")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn validate_refuses_each_hostile_file_without_a_panic() {
    for (name, contents) in hostile_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("web.yaml"), service("web")).unwrap();
        std::fs::write(dir.path().join(name), &contents).unwrap();
        let (code, err) = validate(dir.path());
        assert_eq!(code, 1, "{name}: {err}");
        assert!(
            err.contains(name),
            "{name}: the error names the file: {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("vs.yaml"),
        vs_with("timeout: 9999999999999999h"),
    )
    .unwrap();
    let (_, err) = validate(dir.path());
    assert!(
        err.contains("spec.http[0].timeout") && err.contains("largest duration"),
        "{err}"
    );
}

#[test]
fn validate_names_the_limit_each_oversized_regex_breaks() {
    for (name, contents, why) in regex_bombs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(name), &contents).unwrap();
        let (code, err) = validate(dir.path());
        assert_eq!(code, 1, "{name}: {err:.2000}");
        assert!(err.contains(why), "{name}: expected {why:?} in {err:.2000}");
    }
}

async fn wait_for(cp: &ControlPlane, what: &str, done: impl Fn(&ControlPlane) -> bool) {
    for _ in 0..200 {
        if done(cp) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A directory holding the `web` service, its control plane and the running watch.
fn watched_with_web() -> (tempfile::TempDir, Arc<ControlPlane>, Supervisor) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), service("web")).unwrap();
    let cp: Arc<ControlPlane> = ControlPlane::load(dir.path(), "cluster.local").unwrap();
    let mut tasks = Supervisor::new();
    tasks.spawn_forever(
        "config-watch",
        cp.clone().watch(Debounce {
            after: Duration::from_millis(20),
            max: Duration::from_millis(200),
        }),
    );
    (dir, cp, tasks)
}

#[tokio::test]
async fn the_watch_survives_hostile_files_and_takes_the_next_good_edit() {
    let (dir, cp, mut tasks) = watched_with_web();
    let has = |name: &'static str| {
        move |cp: &ControlPlane| {
            cp.snapshot()
                .services
                .iter()
                .any(|s| s.hostname == format!("{name}.example"))
        }
    };
    assert!(has("web")(&cp));
    let mut good = 0;
    for (name, contents) in hostile_files() {
        let path = dir.path().join(name);
        std::fs::write(&path, &contents).unwrap();
        // Let the watch see it, reject it, and settle; meanwhile nothing may end.
        tokio::select! {
            ended = tasks.ended() => panic!("{name}: {ended}"),
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
        assert!(
            has("web")(&cp),
            "{name}: the last good config stays in force"
        );
        // The hostile file goes; a good edit must still arrive.
        std::fs::remove_file(&path).unwrap();
        good += 1;
        let next: &'static str = Box::leak(format!("svc{good}").into_boxed_str());
        std::fs::write(dir.path().join(format!("{next}.yaml")), service(next)).unwrap();
        tokio::select! {
            ended = tasks.ended() => panic!("after {name}: {ended}"),
            _ = wait_for(&cp, next, has(next)) => {}
        }
    }
}

/// Issue #29: one refused document must not freeze the directory. An EnvoyFilter whose patch is
/// not the Envoy config it patches, a Gateway API Gateway (a Gateway of another group, once misread as Istio's), an
/// invalid VirtualService, a WorkloadEntry the registry cannot use and a broken edit of a
/// served ServiceEntry each stay refused, named with their file; the edit keeps the last good
/// version in force, and every other change applies meanwhile.
#[tokio::test]
async fn a_refused_document_is_refused_alone_and_every_other_edit_applies() {
    let (dir, cp, mut tasks) = watched_with_web();
    let endpoints_of = |cp: &ControlPlane, name: &str| -> Option<Vec<String>> {
        cp.snapshot()
            .services
            .iter()
            .find(|s| s.hostname == format!("{name}.example"))
            .map(|s| s.endpoints.iter().map(|e| e.address.to_string()).collect())
    };
    let refused: &[(&str, String)] = &[
        (
            "envoyfilter.yaml",
            "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: ratelimit, namespace: shop}\nspec: {configPatches: [{applyTo: HTTP_ROUTE, patch: {operation: MERGE, value: {route: {timeuot: 4s}}}}]}\n".into(),
        ),
        (
            "gateway-api.yaml",
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: shop}\nspec: {gatewayClassName: istio, listeners: [{name: http, port: 80, protocol: HTTP}, {name: http, port: 81, protocol: HTTP}]}\n".into(),
        ),
        ("vs.yaml", vs_with("timeout: banana")),
        (
            "we.yaml",
            "kind: WorkloadEntry\nmetadata: {name: vm, namespace: shop}\nspec: {address: not-an-ip, labels: {app: web}}\n---\nkind: ServiceEntry\nmetadata: {name: vms, namespace: shop}\nspec: {hosts: [vms.example], ports: [{number: 80, name: http}], workloadSelector: {labels: {app: web}}}\n".into(),
        ),
    ];
    for (name, text) in refused {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    // A broken edit of web: its last good version (10.1.0.1) stays.
    std::fs::write(
        dir.path().join("web.yaml"),
        service("web").replace("10.1.0.1", "10.1.0.999"),
    )
    .unwrap();
    // And a good new service, which must arrive although all of the above are refused.
    std::fs::write(dir.path().join("api.yaml"), service("api")).unwrap();
    tokio::select! {
        ended = tasks.ended() => panic!("{ended}"),
        _ = wait_for(&cp, "api", |cp| endpoints_of(cp, "api").is_some()) => {}
    }
    assert_eq!(endpoints_of(&cp, "web"), Some(vec!["10.1.0.1".to_string()]));
    // The ServiceEntry beside the unusable WorkloadEntry applies without it.
    assert_eq!(endpoints_of(&cp, "vms"), Some(vec![]));
    let rejected = cp.rejected();
    let said: Vec<String> = rejected.iter().map(ToString::to_string).collect();
    let find = |needle: &str| {
        said.iter()
            .find(|s| s.contains(needle))
            .unwrap_or_else(|| panic!("no rejection with {needle:?} in {said:#?}"))
    };
    let ef = find("envoyfilter.yaml: document 1: ");
    assert!(
        ef.contains("EnvoyFilter ratelimit")
            && ef.contains("spec.configPatches[0].patch.value (envoy.config.route.v3.Route)")
            && ef.contains("timeuot")
            && ef.ends_with("refused, not applied"),
        "{ef}"
    );
    assert!(find("gateway-api.yaml: document 1: ").contains(
        "Gateway gw: spec.listeners[1].name: \"http\" names two listeners; refused, not applied"
    ));
    assert!(find("vs.yaml: document 1: ").contains("spec.http[0].timeout"));
    assert!(
        find("WorkloadEntry shop/vm: ")
            .contains("\"not-an-ip\" is not an IP address; refused, not applied")
    );
    assert!(find("ServiceEntry shop/web: ").ends_with("its last good version stays in force"));
    assert_eq!(said.len(), 5, "{said:#?}");
    // Fixed, each applies.
    std::fs::write(
        dir.path().join("web.yaml"),
        service("web").replace("10.1.0.1", "10.1.0.2"),
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("envoyfilter.yaml")).unwrap();
    tokio::select! {
        ended = tasks.ended() => panic!("{ended}"),
        _ = wait_for(&cp, "web's fix", |cp| endpoints_of(cp, "web") == Some(vec!["10.1.0.2".to_string()])) => {}
    }
    assert_eq!(cp.rejected().len(), 3, "{:#?}", cp.rejected());
}
