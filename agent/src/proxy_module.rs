//! The proxy module (`libistio_module.so`, Istio's extensions for upstream Envoy) beside the
//! Envoy the agent starts: where it is, and whether that Envoy is the build the module's ABI
//! declarations were written for. Envoy itself does not check (a module of another ABI loads
//! and then misbehaves), so the agent refuses to start Envoy unless both hold.
//!
//! The module is looked for, in order, in the directory `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`
//! names (as Envoy would), beside the agent's own executable, and in `../lib/istio` from it
//! (the layout of the proxy image and the .deb: `/usr/local/bin/pilot-agent`,
//! `/usr/local/lib/istio/libistio_module.so`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use mesh_common::module::{ENVOY_BUILD, LIBRARY, SEARCH_PATH_ENV};

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error(
        "the proxy module {LIBRARY} is in none of {searched}; Istio's metadata exchange and \
         standard metrics run in it (install it beside pilot-agent, or set {SEARCH_PATH_ENV} to \
         its directory)"
    )]
    NotFound { searched: String },
    #[error(
        "cannot tell which Envoy {binary} is ({why}); the proxy module needs Envoy {ENVOY_BUILD}"
    )]
    UnknownEnvoy { binary: String, why: String },
    #[error(
        "Envoy {binary} is {found}; the proxy module {LIBRARY} is built for Envoy {ENVOY_BUILD} \
         only (a module's ABI is tied to one Envoy build): install that Envoy"
    )]
    WrongEnvoy { binary: String, found: String },
}

/// The directories the module is looked for in, in order.
pub fn candidates(search_path: Option<&str>, exe: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(p) = search_path.filter(|p| !p.is_empty()) {
        dirs.push(PathBuf::from(p));
    }
    if let Some(dir) = exe.and_then(Path::parent) {
        dirs.push(dir.to_path_buf());
        dirs.push(dir.join("../lib/istio"));
    }
    dirs
}

/// The directory holding the module.
pub fn locate(dirs: &[PathBuf]) -> Result<PathBuf, ModuleError> {
    dirs.iter()
        .find(|d| d.join(LIBRARY).is_file())
        .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()))
        .ok_or_else(|| ModuleError::NotFound {
            searched: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Whether `version` (what `envoy --version` prints) is the module's Envoy build.
pub fn check_version(binary: &str, version: &str) -> Result<(), ModuleError> {
    let found = version
        .split_whitespace()
        .find(|w| w.contains('/') && w.len() > 40)
        .map(str::to_string);
    match found {
        Some(v) if v.starts_with(ENVOY_BUILD) => Ok(()),
        Some(v) => Err(ModuleError::WrongEnvoy {
            binary: binary.to_string(),
            found: v,
        }),
        None => Err(ModuleError::UnknownEnvoy {
            binary: binary.to_string(),
            why: format!("`--version` printed {:?}", version.trim()),
        }),
    }
}

/// The module's directory, once the Envoy at `binary` is known to be its build.
pub async fn prepare(binary: &Path) -> Result<PathBuf, ModuleError> {
    let exe = std::env::current_exe().ok();
    let dir = locate(&candidates(
        std::env::var(SEARCH_PATH_ENV).ok().as_deref(),
        exe.as_deref(),
    ))?;
    let name = binary.display().to_string();
    let run = tokio::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => {
            return Err(ModuleError::UnknownEnvoy {
                binary: name,
                why: e.to_string(),
            });
        }
        Err(_) => {
            return Err(ModuleError::UnknownEnvoy {
                binary: name,
                why: "`--version` did not answer in 10 s".to_string(),
            });
        }
    };
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    check_version(&name, &text)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_the_modules_envoy_build_passes() {
        let ours =
            format!("\n/usr/local/bin/envoy  version: {ENVOY_BUILD}/Clean/RELEASE/BoringSSL\n");
        assert!(check_version("envoy", &ours).is_ok());
        let other = "envoy  version: 0123456789abcdef0123456789abcdef01234567/1.39.1/Clean/RELEASE/BoringSSL";
        let e = check_version("envoy", other).unwrap_err().to_string();
        assert!(e.contains("1.39.1") && e.contains(ENVOY_BUILD), "{e}");
        let e = check_version("/bin/fake", "").unwrap_err().to_string();
        assert!(e.contains("/bin/fake"), "{e}");
    }

    #[test]
    fn the_search_path_then_beside_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("bin/pilot-agent");
        let lib = dir.path().join("lib/istio");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        let dirs = candidates(Some(""), Some(&exe));
        assert!(locate(&dirs).unwrap_err().to_string().contains("bin"));
        std::fs::write(lib.join(LIBRARY), b"").unwrap();
        assert_eq!(locate(&dirs).unwrap(), std::fs::canonicalize(&lib).unwrap());
        std::fs::write(exe.parent().unwrap().join(LIBRARY), b"").unwrap();
        assert_eq!(
            locate(&dirs).unwrap(),
            std::fs::canonicalize(exe.parent().unwrap()).unwrap()
        );
    }
}
