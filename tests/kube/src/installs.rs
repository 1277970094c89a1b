//! Where set-up installed what the test cluster runs: Kubernetes' binaries
//! (`scripts/install-kube.sh`) and the Gateway API conformance suite with its CRDs and echo
//! backends (`scripts/install-gateway-conformance.sh`). A missing piece fails the test naming
//! the set-up step.

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::node::KUBE_VERSION;

/// Where `scripts/install-kube.sh` installs: `$KUBE_HOME`, else `/opt/kube-test/VERSION`.
pub fn kube_home() -> PathBuf {
    harness::install_home("KUBE_HOME", &format!("/opt/kube-test/{KUBE_VERSION}"))
}

/// The path of Kubernetes binary `name`; missing, the test fails naming the set-up step (or
/// skips when SKIP_E2E=1 asked for it: then `Err`).
pub fn kube_bin(name: &str) -> Result<PathBuf> {
    harness::installed_bin(&kube_home(), name, name, "scripts/install-kube.sh")
}

/// The Gateway API release the conformance suite and the CRDs are from (Istio release-1.31's).
pub const VERSION: &str = "v1.6.0";

/// Where `scripts/install-gateway-conformance.sh` installs.
pub fn home() -> PathBuf {
    harness::install_home(
        "GATEWAY_CONFORMANCE_HOME",
        &format!("/opt/gateway-conformance/{VERSION}"),
    )
}

/// A file of the install (`bin/conformance.test`, `bin/echo-basic`, `crd/experimental`);
/// missing, the test fails naming the set-up step.
pub fn installed(rel: &str) -> Result<PathBuf> {
    let p = home().join(rel);
    if p.exists() {
        return Ok(p);
    }
    bail!(
        "{} is missing: run scripts/install-gateway-conformance.sh (or scripts/setup.sh --tests)",
        p.display()
    )
}
