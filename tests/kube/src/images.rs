//! What the test kubelet runs for an image: images map to local programs. The node has no
//! container runtime; our proxy image's programs are the workspace's own binaries, and the
//! sample apps are stand-ins that answer as the real ones do (`tests/src/bin/bookinfo.rs`).
//!
//! Why local programs and not podman: a pod starts in milliseconds, the binaries under test are
//! the ones cargo just built (no image build in the test loop), and the sidecar reads its
//! mounted files relative to its working directory, as Istio's agent does, so a directory per
//! pod is all a container's filesystem needs to be. `scripts/image.sh` proves the images
//! themselves.

use anyhow::{Result, bail};

/// Our proxy image as the tests install Istio with it (`values.global.hub`/`tag`).
pub const PROXY_HUB: &str = "localhost/istio-rs";
pub const PROXY_TAG: &str = "test";

/// An image's entrypoint and the user it runs as when the pod does not say.
#[derive(Debug, Clone)]
pub struct Image {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// The image's `USER` (never 1337, the proxy's, for an app).
    pub uid: u32,
    pub gid: u32,
    /// Its program reads its mounts at their absolute paths, as in a container's own root (the
    /// kubelet binds them there); otherwise relative to the working directory, as Istio's agent
    /// does.
    pub root_mounts: bool,
    /// Files the image has at absolute paths (the node's file, the path in the container).
    pub files: Vec<(std::path::PathBuf, String)>,
    /// Directories before the node's on the image's PATH (its other programs).
    pub path: Vec<String>,
}

impl Image {
    fn program(entrypoint: Vec<String>, uid: u32, gid: u32) -> Image {
        Image {
            entrypoint,
            cmd: vec![],
            uid,
            gid,
            root_mounts: false,
            files: vec![],
            path: vec![],
        }
    }
}

/// The image `reference` as this node runs it, or an error naming it.
pub fn resolve(reference: &str) -> Result<Image> {
    let (repo, _tag) = split_reference(reference);
    let name = repo.rsplit('/').next().unwrap_or(repo);
    let bin = |b: &str| harness::binary(b).display().to_string();
    if repo == format!("{PROXY_HUB}/proxyv2") {
        // Istio's proxyv2 image: ENTRYPOINT pilot-agent (istio-init runs `pilot-agent
        // istio-iptables ...`, the sidecar `pilot-agent proxy sidecar ...`), USER 1337.
        return Ok(Image::program(vec![bin("pilot-agent")], 1337, 1337));
    }
    if let Some(rest) = name.strip_prefix("examples-bookinfo-") {
        // examples-bookinfo-SERVICE-VERSION; the real images run as uid 1000.
        let Some((service, version)) = rest.rsplit_once('-') else {
            bail!("image {reference}: not examples-bookinfo-SERVICE-VERSION");
        };
        if !["productpage", "details", "reviews", "ratings"].contains(&service) {
            bail!("image {reference}: no Bookinfo service {service}");
        }
        return Ok(Image::program(
            vec![bin("bookinfo"), service.to_string(), version.to_string()],
            1000,
            1000,
        ));
    }
    if repo.ends_with("curlimages/curl") {
        // ENTRYPOINT curl, USER curl_user (100:101); the samples override the command.
        return Ok(Image::program(vec!["/usr/bin/curl".into()], 100, 101));
    }
    if repo.starts_with("registry.k8s.io/gateway-api/") && name == "echo-basic" {
        // The Gateway API conformance backends' server, built from the suite's own module at
        // the suite's version (scripts/install-gateway-conformance.sh); the image runs as root.
        let echo = crate::installs::installed("bin/echo-basic")?;
        return Ok(Image {
            root_mounts: true,
            ..Image::program(vec![echo.display().to_string()], 0, 0)
        });
    }
    if repo.starts_with("registry.k8s.io/gateway-api/") && name == "echo-advanced" {
        // Istio's echo server and client (istio.io/istio/pkg/test/echo at the installed Istio
        // version), which this image packages: ENTRYPOINT the server, `client` on the PATH for
        // the mesh tests' exec, and a serving certificate at /cert.crt and /cert.key.
        let dir = crate::installs::installed("istio-echo")?;
        let file = |f: &str| (dir.join(f), format!("/{f}"));
        return Ok(Image {
            root_mounts: true,
            files: vec![file("cert.crt"), file("cert.key")],
            path: vec![dir.join("bin").display().to_string()],
            ..Image::program(vec![dir.join("bin/server").display().to_string()], 0, 0)
        });
    }
    if name == "tcp-echo-server" {
        // Istio's tcp-echo sample server (`samples/tcp-echo`): ENTRYPOINT /bin/tcp-echo, CMD
        // `9000 hello`, FROM scratch (root); our stand-in answers each line as it does.
        return Ok(Image {
            cmd: vec!["9000".into(), "hello".into()],
            ..Image::program(vec![bin("tcp-echo")], 0, 0)
        });
    }
    if repo == "registry.k8s.io/coredns/coredns" {
        // The conformance suite's UDP backend (UDPRoute only, a feature neither Istio nor we
        // support, so no test sends it a datagram). Its pod must still be Ready for the suite
        // to start: a UDP echo on its port 53 stands in; the CoreDNS arguments are ignored.
        return Ok(Image::program(
            vec![bin("netprobe"), "udp-echo".into(), "53".into()],
            65532,
            65532,
        ));
    }
    bail!(
        "image {reference}: this node has no such image (it runs {PROXY_HUB}/proxyv2, \
         examples-bookinfo-*, curlimages/curl, tcp-echo-server, the Gateway API conformance echo-basic and \
         echo-advanced, and a coredns stand-in)"
    )
}

fn split_reference(reference: &str) -> (&str, &str) {
    let without_digest = reference.split('@').next().unwrap_or(reference);
    match without_digest.rsplit_once(':') {
        // A ':' after the last '/' is a tag; before it, a registry port.
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (without_digest, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_map_to_programs() {
        let p = resolve("localhost/istio-rs/proxyv2:test").unwrap();
        assert!(p.entrypoint[0].ends_with("/pilot-agent"));
        assert_eq!(p.uid, 1337);
        let b = resolve("registry.istio.io/release/examples-bookinfo-reviews-v2:1.20.3").unwrap();
        assert_eq!(&b.entrypoint[1..], ["reviews", "v2"]);
        assert_ne!(b.uid, 1337);
        assert!(resolve("docker.io/curlimages/curl:8.16.0").is_ok());
        let echo = resolve("registry.istio.io/release/tcp-echo-server:1.3").unwrap();
        assert!(echo.entrypoint[0].ends_with("/tcp-echo"));
        assert_eq!(echo.cmd, ["9000", "hello"]);
        let err = resolve("docker.io/istio/proxyv2:1.31.0").unwrap_err();
        assert!(err.to_string().contains("docker.io/istio/proxyv2:1.31.0"));
        assert!(resolve("localhost:5000/istio-rs/proxyv2").is_err());
    }
}
