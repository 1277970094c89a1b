//! Istio's own binaries (pilot-agent, pilot-discovery, istioctl of the release-1.31 branch), built
//! by `scripts/install-istio.sh`: the oracles tests compare our rules and bootstrap with. A test
//! that needs one fails without it, as every end-to-end test fails without its tools, unless
//! skipping was asked for with SKIP_E2E=1 (`crate::cannot_run`).

use std::path::PathBuf;

use anyhow::Result;

/// The Istio build the oracles are: `ISTIO_BUILD_VERSION` of `scripts/install-istio.sh`, which is
/// where the version is chosen (a unit test below fails when the two disagree).
pub const ISTIO_BUILD_VERSION: &str = "1.31-eed52ebb66ad";

/// Where `scripts/install-istio.sh` installs: `$ISTIO_HOME`, else `/opt/istio-oracle/VERSION`.
pub fn istio_home() -> PathBuf {
    crate::install_home(
        "ISTIO_HOME",
        &format!("/opt/istio-oracle/{ISTIO_BUILD_VERSION}"),
    )
}

/// The path of Istio's binary `name` (e.g. "pilot-agent"). Missing, it is a test failure naming
/// the set-up step; `Err` only when SKIP_E2E=1 asked to skip instead, and the caller returns.
pub fn istio_bin(name: &str) -> Result<PathBuf> {
    crate::installed_bin(
        &istio_home(),
        name,
        &format!("Istio's {name}"),
        "scripts/install-istio.sh",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_the_install_scripts() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-istio.sh");
        let text = std::fs::read_to_string(&script).expect("scripts/install-istio.sh");
        let assigned = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("ISTIO_BUILD_VERSION="))
            .map(|v| v.trim_matches('"'));
        assert_eq!(
            assigned,
            Some(ISTIO_BUILD_VERSION),
            "{} and tests/src/istio.rs name different Istio builds",
            script.display()
        );
        assert!(text.contains("/opt/istio-oracle/${ISTIO_BUILD_VERSION}"));
    }
}
