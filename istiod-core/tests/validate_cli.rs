#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! `istiod-core validate DIR`: every error named by file and document, exit 1; a good directory
//! exits 0 with a summary.

use std::process::Command;

fn validate(dir: &std::path::Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_istiod-core"))
        .arg("validate")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn reports_every_bad_file_and_exits_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("good.yaml"),
        "kind: ServiceEntry\nmetadata: {name: web, namespace: shop}\nspec: {hosts: [web.example], ports: [{number: 80, name: http}]}\n",
    )
    .unwrap();
    let (code, out, _) = validate(dir.path());
    assert_eq!(code, 0);
    assert!(out.contains("ok (1 resources, 1 services)"), "{out}");

    std::fs::write(
        dir.path().join("a.yaml"),
        "kind: ServiceEntry\nmetadata: {name: x}\nspec: {hosts: []}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.yaml"),
        "kind: PeerAuthentication\nmetadata: {name: p}\nspec: {mtls: {mode: STRIKT}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("c.yaml"),
        "kind: WorkloadEntry\nmetadata: {name: w, namespace: n}\nspec: {address: 10.0.0.300, labels: {app: a}}\n---\nkind: ServiceEntry\nmetadata: {name: s, namespace: n}\nspec: {hosts: [h], workloadSelector: {labels: {app: a}}}\n",
    )
    .unwrap();
    let (code, _, err) = validate(dir.path());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("a.yaml: document 1: ServiceEntry x"), "{err}");
    assert!(
        err.contains("b.yaml: document 1: PeerAuthentication p"),
        "{err}"
    );
    assert!(err.contains("STRIKT"), "{err}");
    assert!(
        err.contains("WorkloadEntry n/w: \"10.0.0.300\" is not an IP address"),
        "{err}"
    );
    assert!(err.contains("3 error(s)"), "{err}");
}

#[test]
fn warns_about_what_it_accepts_and_does_not_act_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("dr.yaml"),
        "kind: DestinationRule\nmetadata: {name: r, namesapce: book}\nspec: {host: reviews, trafficPolicy: {loadBalancer: {simple: RANDOM, localityLbSetting: {failover: [{from: r1, to: r2}]}}, fastest: true}}\n",
    )
    .unwrap();
    let (code, _, err) = validate(dir.path());
    assert_eq!(code, 0, "{err}");
    for expected in [
        "warning: DestinationRule default/r: metadata.namesapce: unknown field",
        "warning: DestinationRule default/r: spec.trafficPolicy.fastest: unknown field, ignored",
        "warning: DestinationRule default/r: spec.trafficPolicy.loadBalancer.localityLbSetting: failover needs outlierDetection in the same policy: not applied",
    ] {
        assert!(err.contains(expected), "{expected}\n{err}");
    }
}
