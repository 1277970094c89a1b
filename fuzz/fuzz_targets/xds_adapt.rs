//! The agent's xDS adaptation (`pilot_agent::xds_adapt::adapt`), which edits what a remote
//! control plane sends at the protobuf wire level: any bytes give a result or an error, never a
//! panic; a response it changes still decodes as the same kind of response (with the same
//! type URL and nonce) whenever the input did.
//!
//! Input: one byte (bit 0: Delta, else state of the world), then the response body.
#![no_main]

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use libfuzzer_sys::fuzz_target;
use pilot_agent::xds_adapt::{Adapted, adapt};
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, msg)) = data.split_first() else {
        return;
    };
    let delta = flags & 1 == 1;
    let Ok(Adapted::Changed(out, _)) = adapt(delta, msg) else {
        return;
    };
    if delta {
        if let Ok(before) = DeltaDiscoveryResponse::decode(msg) {
            let after = DeltaDiscoveryResponse::decode(out.as_ref())
                .expect("an adapted Delta response decodes");
            assert_eq!(after.type_url, before.type_url);
            assert_eq!(after.nonce, before.nonce);
        }
    } else if let Ok(before) = DiscoveryResponse::decode(msg) {
        let after = DiscoveryResponse::decode(out.as_ref()).expect("an adapted response decodes");
        assert_eq!(after.type_url, before.type_url);
        assert_eq!(after.nonce, before.nonce);
        assert!(after.resources.len() <= before.resources.len());
    }
});
