//! The files the config is parsed from, read in one place before any parsing: the pod's
//! downward-API files, the mesh config file and resolv.conf. A file that is absent is as if
//! empty (each is optional); a file that exists and cannot be read is an error naming it.

use std::path::{Path, PathBuf};

use super::identity::MountedCerts;
use super::{ConfigError, ProxyArgs, err};

/// The resolv.conf read when `ProxyArgs::resolv_conf` is unset.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// File contents the parse works on; `None` where the file is absent.
#[derive(Debug)]
pub struct Inputs {
    /// `<pod_info_dir>/labels`.
    pub labels: Option<String>,
    /// `<pod_info_dir>/annotations`.
    pub annotations: Option<String>,
    /// `--meshConfig`, with its path.
    pub mesh_config: Option<(PathBuf, String)>,
    /// resolv.conf, or why it could not be read: only the DNS proxy uses it, so its error is
    /// reported only when the DNS proxy is on.
    pub resolv_conf: Result<Option<String>, ConfigError>,
    /// Which mounted-certificate directories are complete.
    pub mounted_certs: MountedCerts,
}

impl Inputs {
    pub fn read(args: &ProxyArgs) -> Result<Inputs, ConfigError> {
        let pod_file = |name: &str| match &args.pod_info_dir {
            Some(dir) => read_optional(&format!("pod {name} file"), &dir.join(name)),
            None => Ok(None),
        };
        let mesh_config = match &args.mesh_config {
            Some(path) => read_optional("meshConfig file", path)?.map(|text| (path.clone(), text)),
            None => None,
        };
        let resolv = args
            .resolv_conf
            .clone()
            .unwrap_or_else(|| PathBuf::from(RESOLV_CONF));
        Ok(Inputs {
            labels: pod_file("labels")?,
            annotations: pod_file("annotations")?,
            mesh_config,
            resolv_conf: read_optional("resolv.conf", &resolv),
            mounted_certs: MountedCerts::look(),
        })
    }
}

/// `path`'s text; `None` when there is no such file.
pub fn read_optional(input: &str, path: &Path) -> Result<Option<String>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(err(
            input,
            &path.display().to_string(),
            &format!("a readable file ({e})"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_files_are_empty_and_unreadable_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let args = ProxyArgs {
            pod_info_dir: Some(dir.path().to_path_buf()),
            mesh_config: Some(dir.path().join("mesh")),
            resolv_conf: Some(dir.path().join("resolv.conf")),
            ..ProxyArgs::default()
        };
        let inputs = Inputs::read(&args).unwrap();
        assert_eq!(inputs.labels, None);
        assert!(inputs.mesh_config.is_none());
        assert!(matches!(inputs.resolv_conf, Ok(None)));

        // A directory where the file should be cannot be read, even by root.
        std::fs::create_dir(dir.path().join("labels")).unwrap();
        let e = Inputs::read(&args).unwrap_err();
        assert_eq!(e.input, "pod labels file");
        assert_eq!(e.value, dir.path().join("labels").display().to_string());
        assert!(e.expected.starts_with("a readable file"), "{e}");

        std::fs::remove_dir(dir.path().join("labels")).unwrap();
        std::fs::create_dir(dir.path().join("resolv.conf")).unwrap();
        let inputs = Inputs::read(&args).unwrap();
        assert_eq!(inputs.resolv_conf.unwrap_err().input, "resolv.conf");
    }
}
