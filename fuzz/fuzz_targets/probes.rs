//! The probe-rewrite config (`pilot_agent::config::probes::parse`, ISTIO_KUBE_APP_PROBERS):
//! any text is a set of probes or an error, never a panic; every accepted probe is under
//! /app-health/ or /app-lifecycle/, targets a port that is neither 0 nor one of the proxy's,
//! and an HTTP probe's path is absolute.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pilot_agent::config::probes::{Check, parse};

const PROXY_PORTS: [u16; 9] = [
    15000, 15001, 15004, 15006, 15008, 15020, 15021, 15053, 15090,
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(probes) = parse(text) else {
        return;
    };
    for (key, probe) in probes {
        assert!(key.starts_with("/app-health/") || key.starts_with("/app-lifecycle/"));
        let port = match &probe.check {
            Check::Http { path, port, .. } => {
                assert!(path.starts_with('/'), "{path:?}");
                *port
            }
            Check::Tcp { port } | Check::Grpc { port, .. } => *port,
        };
        assert!(
            port != 0 && !PROXY_PORTS.contains(&port),
            "{key}: port {port}"
        );
    }
});
