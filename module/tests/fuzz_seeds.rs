//! The `peer_metadata` fuzz target's inputs replayed in the stable suite: every committed seed
//! under `fuzz/seeds/peer_metadata` (and, when a local fuzzing run left them, up to
//! `MAX_CORPUS` files of its corpus and its reproducers) goes through the same properties
//! (`support/peer_properties.rs`, which the fuzz target includes), so a regression on a known
//! input fails `cargo test` without nightly or cargo-fuzz.

#[path = "support/peer_properties.rs"]
mod peer_properties;

use std::path::{Path, PathBuf};

use istio_module::peer::{Frame, Workload, decode_frame};

const MAX_CORPUS: usize = 500;

fn files(dir: &Path, cap: usize) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p| p.is_file());
    paths.sort();
    paths.truncate(cap);
    paths
}

#[test]
fn peer_metadata_seeds_keep_their_properties() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let seeds = files(&fuzz.join("seeds/peer_metadata"), usize::MAX);
    assert!(
        seeds.len() >= 5,
        "fuzz/seeds/peer_metadata holds {} seeds (python3 fuzz/seeds.py writes them)",
        seeds.len()
    );
    // The seeds reach the decoders' success paths, not only their refusals.
    let (mut headers, mut frames) = (0, 0);
    for path in &seeds {
        let data = std::fs::read(path).expect("a seed readable");
        match data.split_first() {
            Some((1, rest)) => {
                let value = std::str::from_utf8(rest).unwrap_or_default();
                headers += usize::from(Workload::from_header(value, &[]).is_some());
            }
            Some((0, rest)) => {
                frames += usize::from(matches!(
                    decode_frame(rest, &[]),
                    Frame::Frame { peer: Some(_), .. }
                ));
            }
            _ => {}
        }
    }
    assert!(
        headers >= 1 && frames >= 2,
        "seeds decoding to a peer: {headers} headers, {frames} frames"
    );
    let mut all = seeds;
    all.extend(files(&fuzz.join("corpus/peer_metadata"), MAX_CORPUS));
    all.extend(files(&fuzz.join("artifacts/peer_metadata"), MAX_CORPUS));
    for path in &all {
        let data = std::fs::read(path).expect("a seed readable");
        if std::panic::catch_unwind(|| peer_properties::check(&data)).is_err() {
            panic!(
                "peer_metadata: {} broke a property (see above)",
                path.display()
            );
        }
    }
}
