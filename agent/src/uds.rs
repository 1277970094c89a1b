//! The Unix sockets the agent serves Envoy on (SDS, xDS): the socket is 0600 and owned by Envoy's
//! uid, and every connection's peer uid (SO_PEERCRED) must be one of the allowed ones, so another
//! process of the pod (the app, as another uid) can neither read certificates nor speak xDS.

use std::path::Path;

use futures::Stream;
use tokio::net::{UnixListener, UnixStream};

/// Sets `dir`'s permission bits to `mode`. A directory another uid owns cannot be chmod-ed (a
/// pod's emptyDir is root's, mode 0777, while the agent runs as 1337): it is left as it is, and
/// its mode is returned for the caller to judge; `None` when `mode` was set.
pub(crate) fn set_dir_mode(dir: &Path, mode: u32) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)) {
        Ok(()) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let meta = std::fs::metadata(dir)?;
            if meta.uid() == nix::unistd::geteuid().as_raw() {
                return Err(e);
            }
            Ok(Some(meta.mode() & 0o7777))
        }
        Err(e) => Err(e),
    }
}

/// Binds `path` (replacing a stale socket) as 0600, owned by `owner` when given (the agent is
/// root and Envoy is not). With `private_dir`, the socket's directory is made 0700 and owned by
/// `owner` too; a directory another uid owns (a pod's emptyDir) is left as it is, and the socket's
/// own mode and the peer check guard it.
pub fn bind(path: &Path, owner: Option<u32>, private_dir: bool) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    if private_dir {
        match set_dir_mode(dir, 0o700)? {
            None => {
                if let Some(uid) = owner {
                    std::os::unix::fs::chown(dir, Some(uid), Some(uid))?;
                }
            }
            Some(mode) => tracing::debug!(
                dir = %dir.display(),
                mode = format!("{mode:o}"),
                "socket directory owned by another uid: left as it is"
            ),
        }
    }
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    if let Some(uid) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(uid))?;
    }
    Ok(listener)
}

/// Accepted connections whose peer is one of `allowed` uids; others are closed and logged,
/// naming `what` the socket serves.
pub fn authorized(
    listener: UnixListener,
    allowed: Vec<u32>,
    what: &'static str,
) -> impl Stream<Item = Result<UnixStream, std::io::Error>> {
    futures::stream::unfold((listener, allowed), move |(listener, allowed)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => match stream.peer_cred() {
                    Ok(cred) if allowed.contains(&cred.uid()) => {
                        return Some((Ok(stream), (listener, allowed)));
                    }
                    Ok(cred) => tracing::warn!(
                        uid = cred.uid(),
                        pid = ?cred.pid(),
                        "{what} connection refused: only the proxy's uid, the agent's and root may connect"
                    ),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "{what} connection refused: no peer credentials"
                    ),
                },
                Err(e) => return Some((Err(e), (listener, allowed))),
            }
        }
    })
}

/// The uids allowed on the agent's sockets: root, Envoy's and the agent's own.
pub fn allowed_uids(envoy_uid: u32) -> Vec<u32> {
    let mut uids = vec![0, envoy_uid, nix::unistd::geteuid().as_raw()];
    uids.sort_unstable();
    uids.dedup();
    uids
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use futures::StreamExt;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    #[tokio::test]
    async fn sockets_are_0600_and_other_uids_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("private/socket");
        let listener = bind(&path, None, true).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(mode(&path), 0o600);
        let me = nix::unistd::geteuid().as_raw();
        // Only a uid that is not ours is allowed: our own connection must be dropped.
        let mut accepted = Box::pin(authorized(listener, vec![me.wrapping_add(4242)], "test"));
        let _client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let next = tokio::time::timeout(Duration::from_millis(300), accepted.next()).await;
        assert!(next.is_err(), "a connection from another uid was accepted");
    }

    #[tokio::test]
    async fn a_shared_directory_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("XDS");
        let _listener = bind(&path, None, false).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(dir.path()), 0o755);
        assert_eq!(mode(&path), 0o600);
    }
}
