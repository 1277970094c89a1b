//! The CA's CSR handling (`istiod_core::ca::Ca::sign`): a CSR, an identity and a requested
//! lifetime. Anything is a signed chain or an error, never a panic; a signed leaf names exactly
//! the identity it was signed for (never what the CSR asks), is no CA, and carries the CSR's key.
//!
//! Input: one byte (bit 0: the CSR is DER, wrapped in PEM here; else it is the PEM text), the
//! requested lifetime in seconds (big-endian i32), the identity URI up to a newline, the CSR.
//!
//! `istiod-core/tests/fuzz_seeds.rs` replays the seeds through a copy of this body on stable:
//! keep the two in step.
#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use istiod_core::ca::Ca;
use libfuzzer_sys::fuzz_target;
use mesh_common::identity::{Identity, uri_sans};
use x509_parser::prelude::FromDer;

struct World {
    ca: Ca,
    _dir: tempfile::TempDir,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::load_or_create(dir.path(), "cluster.local", Duration::from_secs(48 * 3600))
        .expect("CA");
    World { ca, _dir: dir }
});

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn pem(der: &[u8]) -> String {
    let mut out = String::from("-----BEGIN CERTIFICATE REQUEST-----\n");
    for line in base64(der).as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("ascii"));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE REQUEST-----\n");
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Some((ttl, rest)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let ttl = i64::from(i32::from_be_bytes(*ttl));
    let (uri, csr) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let identity = std::str::from_utf8(uri)
        .ok()
        .and_then(|u| Identity::parse(u).ok())
        .unwrap_or_else(|| Identity::new("cluster.local", "default", "default").expect("valid"));
    let csr_pem = if mode & 1 == 1 {
        pem(csr)
    } else {
        match std::str::from_utf8(csr) {
            Ok(text) => text.to_string(),
            Err(_) => return,
        }
    };
    let Ok(chain) = WORLD.ca.sign(&csr_pem, &identity, ttl) else {
        return;
    };
    assert!(chain.len() >= 2, "leaf and root");
    let (_, leaf_pem) = x509_parser::pem::parse_x509_pem(chain[0].as_bytes()).expect("leaf PEM");
    let leaf = leaf_pem.parse_x509().expect("leaf DER");
    assert_eq!(uri_sans(&leaf), vec![identity.to_string()]);
    assert!(!leaf.is_ca(), "a workload certificate is never a CA");
    // Decoded as the CA decodes it (rcgen reads PEM with the `pem` crate, which is laxer than
    // x509-parser's reader).
    let csr_block = pem::parse(&csr_pem).expect("a CSR the CA accepted is PEM");
    let (_, request) = x509_parser::certification_request::X509CertificationRequest::from_der(
        csr_block.contents(),
    )
    .expect("a CSR the CA accepted parses");
    assert_eq!(
        leaf.public_key().raw,
        request.certification_request_info.subject_pki.raw,
        "the leaf carries the CSR's key"
    );
});
