//! Noticing that files changed, by polling their metadata: single files (a mounted certificate,
//! an SDS `file-cert:` resource, a mesh config file) by size and mtime, a directory (a config
//! directory) by its listing's names, sizes and mtimes. Polling works on every filesystem and sees
//! a replaced mount (Kubernetes swaps a ConfigMap or Secret volume's symlink), where inotify may
//! not; a caller that also has inotify events uses `check` to tell real changes from touches.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// A path to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched {
    /// A file: its size and mtime, or its absence.
    File(PathBuf),
    /// A directory: the names, sizes and mtimes of its entries (none when it cannot be listed).
    Dir(PathBuf),
}

/// A file's size and mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    pub len: u64,
    pub modified: Option<SystemTime>,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    File(Option<Stamp>),
    Dir(Vec<(PathBuf, Stamp)>),
}

/// How the watched paths looked at one moment; equal fingerprints mean no change seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(Vec<Seen>);

impl Fingerprint {
    /// Looks at `watched` now.
    pub fn of(watched: &[Watched]) -> Fingerprint {
        Fingerprint(watched.iter().map(look).collect())
    }
}

fn look(watched: &Watched) -> Seen {
    match watched {
        Watched::File(path) => Seen::File(std::fs::metadata(path).ok().map(|m| Stamp::of(&m))),
        Watched::Dir(dir) => {
            let mut entries: Vec<_> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .filter_map(|e| Some((e.path(), Stamp::of(&e.metadata().ok()?))))
                .collect();
            entries.sort();
            Seen::Dir(entries)
        }
    }
}

/// Paths and the fingerprint last marked seen. The caller marks a fingerprint seen once it has
/// acted on it, so a change it could not use yet (a half-written file) is reported again.
#[derive(Debug, Clone)]
pub struct FileWatch {
    watched: Vec<Watched>,
    seen: Option<Fingerprint>,
}

impl FileWatch {
    /// Watches `watched` from how it looks now: only later changes are reported.
    pub fn new(watched: Vec<Watched>) -> FileWatch {
        let seen = Some(Fingerprint::of(&watched));
        FileWatch { watched, seen }
    }

    /// Watches `watched` with nothing seen yet: the first check reports it.
    pub fn unseen(watched: Vec<Watched>) -> FileWatch {
        FileWatch {
            watched,
            seen: None,
        }
    }

    /// Watches other paths from now on; the next check compares them with what was last seen.
    pub fn set_watched(&mut self, watched: Vec<Watched>) {
        self.watched = watched;
    }

    /// The current fingerprint, when it differs from the one last marked seen.
    pub fn check(&self) -> Option<Fingerprint> {
        let now = Fingerprint::of(&self.watched);
        (self.seen.as_ref() != Some(&now)).then_some(now)
    }

    pub fn mark_seen(&mut self, fingerprint: Fingerprint) {
        self.seen = Some(fingerprint);
    }

    /// Checks now, then every `period`, until a change is found; returns it (not yet seen).
    pub async fn next_change(&self, period: Duration) -> Fingerprint {
        loop {
            if let Some(now) = self.check() {
                return now;
            }
            tokio::time::sleep(period).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &std::path::Path, text: &str) {
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_file_change_is_reported_until_marked_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cert.pem");
        let mut watch = FileWatch::unseen(vec![Watched::File(file.clone())]);
        let absent = watch.check().expect("first check reports");
        watch.mark_seen(absent);
        assert_eq!(watch.check(), None);

        write(&file, "one");
        let changed = watch.check().expect("a new file is a change");
        assert!(watch.check().is_some(), "reported again until seen");
        watch.mark_seen(changed);
        assert_eq!(watch.check(), None);

        write(&file, "longer");
        assert!(watch.check().is_some(), "a size change is a change");
    }

    #[test]
    fn a_directory_listing_change_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = FileWatch::new(vec![Watched::Dir(dir.path().to_path_buf())]);
        assert_eq!(watch.check(), None);
        write(&dir.path().join("a.yaml"), "kind: X");
        let added = watch.check().expect("a new entry is a change");
        watch.mark_seen(added);
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        assert!(watch.check().is_some(), "a removed entry is a change");
    }

    #[test]
    fn other_paths_are_compared_with_what_was_seen() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        write(&a, "x");
        let mut watch = FileWatch::new(vec![Watched::File(a.clone())]);
        watch.set_watched(vec![Watched::File(a), Watched::File(b)]);
        assert!(watch.check().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn next_change_polls_until_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mesh");
        let watch = FileWatch::new(vec![Watched::File(file.clone())]);
        let writer = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            write(&file, "defaultConfig: {}");
        };
        let (found, ()) = tokio::join!(watch.next_change(Duration::from_secs(2)), writer);
        assert_eq!(Some(found), watch.check());
    }
}
