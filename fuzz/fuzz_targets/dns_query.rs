//! The DNS proxy's query handling (`pilot_agent::dns::local_reply`): a name table from NDS
//! (decoded from the input, as the agent decodes a pushed one) and a query packet. The proxy
//! either forwards the query or answers it with a well-formed reply carrying the query's id.
//!
//! Input: a big-endian u16 length, that many bytes of `NameTable` protobuf, then the packet.
#![no_main]

use hickory_proto::op::{Message, MessageType};
use istio_proto::nds::NameTable;
use libfuzzer_sys::fuzz_target;
use pilot_agent::dns::{DnsTable, local_reply};
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let len = usize::from(u16::from_be_bytes(*len)).min(rest.len());
    let (table, packet) = rest.split_at(len);
    let names = NameTable::decode(table).unwrap_or_default();
    let dns = DnsTable::from_name_table(&names, "default", Some("default.svc.cluster.local"));
    let _ = dns.to_json();
    let query = Message::from_vec(packet).ok();
    for table in [None, Some(&dns)] {
        for max in [512, 4096] {
            let Some(reply) = local_reply(packet, table, max) else {
                continue;
            };
            let query = query.as_ref().expect("only a parseable query is answered");
            let parsed = Message::from_vec(&reply).unwrap_or_else(|e| {
                panic!("the reply {reply:?} to {packet:?} does not parse: {e}")
            });
            assert_eq!(parsed.metadata.id, query.metadata.id);
            assert_eq!(parsed.metadata.message_type, MessageType::Response);
        }
    }
});
