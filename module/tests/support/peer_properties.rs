//! The properties of the proxy module's decoders of peer input, shared by the fuzz target
//! (`fuzz/fuzz_targets/peer_metadata.rs`) and the seeds' replay in the suite
//! (`module/tests/fuzz_seeds.rs`): one copy, so the two never drift. See the fuzz target for
//! what each asserts.

use istio_module::peer::{Frame, Workload, decode_frame, encode_frame};

fn header(value: &str) {
    let additional = ["role".to_string()];
    if let Some(w) = Workload::from_header(value, &additional) {
        let again =
            Workload::from_header(&w.header_value(), &additional).expect("our own header decodes");
        assert_eq!(again, w, "a decoded peer re-encodes to itself");
    }
}

fn frame(stream: &[u8]) {
    let additional: [String; 0] = [];
    let whole = decode_frame(stream, &additional);
    if let Frame::Frame { len, peer } = &whole {
        assert!(
            *len <= stream.len(),
            "a frame of {len} bytes in {}",
            stream.len()
        );
        if let Some(p) = peer {
            let (w, id) = p.as_ref();
            let encoded = encode_frame(w, id);
            match decode_frame(&encoded, &additional) {
                Frame::Frame { len, peer: Some(q) } => {
                    assert_eq!(len, encoded.len());
                    assert_eq!(&q.0, w);
                }
                other => panic!("our own frame reads as {other:?}"),
            }
        }
    }
    for cut in 0..stream.len() {
        let part = decode_frame(&stream[..cut], &additional);
        match (&whole, &part) {
            (_, Frame::NeedMore) => {}
            (Frame::Frame { len, .. }, got) if cut >= *len => assert_eq!(got, &whole),
            (Frame::NotAFrame, Frame::NotAFrame) => {}
            (w, p) => panic!("{cut} bytes read as {p:?}, all {} as {w:?}", stream.len()),
        }
    }
}

/// One fuzz input: a byte (bit 0: header, else frame), then the header value or the stream.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 1 {
        if let Ok(value) = std::str::from_utf8(rest) {
            header(value);
        }
    } else {
        frame(rest);
    }
}
