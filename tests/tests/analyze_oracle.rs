#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Istio's own `istioctl analyze --use-kube=false` (files only; the release-1.31 build that
//! `scripts/install-istio.sh` installs) beside `istiod-core validate` on Istio's public samples:
//! each of Bookinfo's networking samples alone, then all of them together, and two broken
//! documents. The two agree when both accept or both refuse a set of files, and report the same
//! VirtualService destinations whose subset no DestinationRule defines (istioctl's IST0101,
//! istiod-core's warning). What else each says is printed; the one known difference is held
//! here (docs/conformance.md "istioctl analyze beside istiod-core validate": a name defined twice in a directory), and a new or changed
//! difference fails, naming the files.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use harness::binary;
use harness::istio::istio_bin;

/// What one tool made of a set of files.
#[derive(Debug)]
struct Verdict {
    /// Refused: istioctl could not read a file (exit 65) or found an error other than a
    /// missing subset (exit 79); istiod-core refused a document (exit 1). A missing subset is
    /// an error to istioctl (exit 79) and a warning to istiod-core, which serves the config
    /// (the requests routed there get 503): both report it, neither refuses for it here.
    refused: bool,
    /// `(VirtualService NS/NAME, host+subset)` of each destination whose subset is defined
    /// nowhere.
    missing_subsets: BTreeSet<(String, String)>,
    /// Everything else it said (one line each).
    other: Vec<String>,
}

/// Runs `cmd`: its exit code, which must be one of `expected`, and its output and errors.
fn output(cmd: &mut Command, expected: &[i32]) -> (i32, String) {
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().unwrap_or(-1);
    assert!(expected.contains(&code), "{cmd:?}: exit {code}:\n{text}");
    (code, text)
}

/// `istioctl analyze --use-kube=false FILES`.
fn analyze(istioctl: &Path, files: &[PathBuf]) -> Verdict {
    let (code, text) = output(
        Command::new(istioctl)
            .args(["analyze", "--use-kube=false"])
            .args(files),
        &[0, 65, 79],
    );
    let mut missing_subsets = BTreeSet::new();
    let mut other = Vec::new();
    for line in text.lines() {
        // Error [IST0101] (VirtualService default/reviews FILE:11) Referenced host+subset in
        // destinationrule not found: "reviews+v3"
        if let Some(rest) = line.strip_prefix("Error [IST0101] (VirtualService ")
            && let Some((object, what)) = rest.split_once(')')
            && let Some(subset) =
                what.strip_prefix(" Referenced host+subset in destinationrule not found: ")
        {
            let name = object.split_whitespace().next().unwrap_or_default();
            missing_subsets.insert((name.to_string(), subset.trim_matches('"').to_string()));
        } else if line.starts_with("Error [")
            || line.starts_with("Warning [")
            || line.contains("error processing")
        {
            other.push(line.to_string());
        }
    }
    Verdict {
        refused: code == 65 || other.iter().any(|l| l.starts_with("Error [")),
        missing_subsets,
        other,
    }
}

/// `istiod-core validate DIR` of a directory holding `files`.
fn validate(files: &[PathBuf]) -> Verdict {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        std::fs::copy(f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let (code, text) = output(
        Command::new(binary("istiod-core"))
            .arg("validate")
            .arg(dir.path()),
        &[0, 1],
    );
    let mut missing_subsets = BTreeSet::new();
    let mut other = Vec::new();
    for line in text.lines() {
        // warning: VirtualService default/reviews: spec.http[0].route[0].destination: subset
        // "v3" of "reviews.default.svc.cluster.local" is in no DestinationRule: ...
        if let Some(rest) = line.strip_prefix("warning: VirtualService ")
            && let Some((name, what)) = rest.split_once(": ")
            && let Some((_, subset)) = what.split_once(".destination: subset ")
            && let Some((subset, host)) = subset.split_once(" of ")
            && let Some((host, _)) = host.split_once(" is in no DestinationRule")
        {
            let short = host.trim_matches('"').split('.').next().unwrap_or_default();
            missing_subsets.insert((
                name.to_string(),
                format!("{short}+{}", subset.trim_matches('"')),
            ));
        } else if line.starts_with("warning:") || line.starts_with("error") || code != 0 {
            other.push(line.to_string());
        }
    }
    Verdict {
        refused: code != 0,
        missing_subsets,
        other,
    }
}

#[test]
fn istioctl_analyze_and_istiod_core_validate_agree_on_istios_samples() {
    let Ok(istioctl) = istio_bin("istioctl") else {
        return;
    };
    let samples = harness::istio::istio_home().join("samples/bookinfo/networking");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&samples)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh --tests)", samples.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "{files:?}");

    // Broken documents: a subset without a name, a duration that is none, an unknown mTLS mode;
    // and a VirtualService without hosts (a delegate), which both accept.
    let broken = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = broken.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let extra = [
        write(
            "no-subset-name.yaml",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: x, namespace: default}\nspec:\n  host: reviews\n  subsets: [{labels: {version: v1}}]\n",
        ),
        write(
            "bad-timeout.yaml",
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x, namespace: default}\nspec:\n  hosts: [reviews]\n  http: [{route: [{destination: {host: reviews}}], timeout: 5x}]\n",
        ),
        write(
            "bad-mode.yaml",
            "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: x, namespace: default}\nspec:\n  mtls: {mode: STRIKT}\n",
        ),
        write(
            "delegate.yaml",
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x, namespace: default}\nspec:\n  http: [{route: [{destination: {host: reviews}}]}]\n",
        ),
    ];

    let mut sets: Vec<Vec<PathBuf>> = files.iter().map(|f| vec![f.clone()]).collect();
    sets.push(files.clone());
    sets.extend(extra.iter().map(|f| vec![f.clone()]));
    let mut disagreements = Vec::new();
    let mut found = 0;
    for set in &sets {
        let name = if set.len() == 1 {
            set[0].file_name().unwrap().to_string_lossy().to_string()
        } else {
            "all samples".to_string()
        };
        let theirs = analyze(&istioctl, set);
        let ours = validate(set);
        found += theirs.missing_subsets.len();
        if theirs.refused != ours.refused {
            disagreements.push(format!(
                "{name}: istioctl analyze {} ({:?}), istiod-core validate {} ({:?})",
                if theirs.refused { "refuses" } else { "accepts" },
                theirs.other,
                if ours.refused { "refuses" } else { "accepts" },
                ours.other
            ));
        }
        // Known: Istio's samples define DestinationRule default/details three times (in
        // destination-rule-all, -all-mtls and fault-injection-details-v1, the last without
        // subset v2). istioctl keeps the last definition of a name, so subset v2 is missing;
        // istiod-core keeps every document of a directory in force, so it is not.
        let known: BTreeSet<(String, String)> = if set.len() > 1 {
            [("default/details".to_string(), "details+v2".to_string())].into()
        } else {
            BTreeSet::new()
        };
        let only_theirs: BTreeSet<_> = theirs
            .missing_subsets
            .difference(&ours.missing_subsets)
            .cloned()
            .collect();
        if only_theirs != known || !ours.missing_subsets.is_subset(&theirs.missing_subsets) {
            disagreements.push(format!(
                "{name}: missing subsets: istioctl analyze {:?}, istiod-core validate {:?}",
                theirs.missing_subsets, ours.missing_subsets
            ));
        }
        eprintln!(
            "{name}: istioctl analyze {} {:?} {:?}; istiod-core validate {} {:?}",
            if theirs.refused { "refused" } else { "ok" },
            theirs.missing_subsets,
            theirs.other,
            if ours.refused { "refused" } else { "ok" },
            ours.missing_subsets,
        );
    }
    assert!(
        found > 0,
        "no missing subset found by istioctl: nothing compared"
    );
    assert!(
        disagreements.is_empty(),
        "istioctl analyze and istiod-core validate disagree:\n{}",
        disagreements.join("\n")
    );
}
