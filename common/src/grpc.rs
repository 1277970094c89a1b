//! gRPC wire knowledge that both the control plane and the agent need: the method paths of the
//! services served or forwarded, and the length-prefixed message framing of gRPC over HTTP/2
//! (gRPC's `PROTOCOL-HTTP2.md`: a compressed flag byte, the message length as a big-endian
//! u32, then the message).

use bytes::{Buf, Bytes, BytesMut};

/// Envoy's Aggregated Discovery Service.
pub const ADS_SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
/// State-of-the-world ADS.
pub const ADS_SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// Delta ADS.
pub const ADS_DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Length of the header before every message.
pub const FRAME_HEADER_LEN: usize = 5;

/// The header of an uncompressed message of `len` bytes. A length past `u32::MAX` (which no
/// peer would accept) is written as `u32::MAX`.
pub fn frame_header(len: usize) -> [u8; FRAME_HEADER_LEN] {
    let [a, b, c, d] = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    [0, a, b, c, d]
}

/// A message header that is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The compressed flag is set; we negotiate no compression, so none should come.
    #[error("compressed message (flag {0}); only uncompressed messages are accepted")]
    Compressed(u8),
    #[error("message of {len} bytes is over the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
}

/// Reassembles messages from a stream of data pieces cut anywhere. A header that announces a
/// compressed or oversized message is an error as soon as it is read, before anything of its
/// body is buffered; the buffer is let go whenever it empties, so an idle stream holds none.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    max: usize,
}

impl FrameDecoder {
    /// A decoder refusing messages longer than `max` bytes.
    pub fn new(max: usize) -> FrameDecoder {
        FrameDecoder {
            buf: BytesMut::new(),
            max,
        }
    }

    /// Adds a piece of the stream.
    pub fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message, if one is buffered.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, FrameError> {
        let Some(header) = self.buf.get(..FRAME_HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if header[0] != 0 {
            return Err(FrameError::Compressed(header[0]));
        }
        if len > self.max {
            return Err(FrameError::TooLarge { len, max: self.max });
        }
        if self.buf.len() < FRAME_HEADER_LEN + len {
            return Ok(None);
        }
        self.buf.advance(FRAME_HEADER_LEN);
        let message = self.buf.split_to(len).freeze();
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
        Ok(Some(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = frame_header(message.len()).to_vec();
        out.extend_from_slice(message);
        out
    }

    #[test]
    fn messages_cut_anywhere_come_out_whole() {
        let a = framed(b"first");
        let b = framed(&[7u8; 300]);
        let all: Vec<u8> = a.iter().chain(&b).copied().collect();
        // Cut inside the first header, inside the second body, and at the end.
        let mut decoder = FrameDecoder::new(1024);
        let mut got = Vec::new();
        let mut at = 0;
        for cut in [2, a.len() + 7, all.len()] {
            decoder.extend(&all[at..cut]);
            at = cut;
            while let Some(m) = decoder.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(
            got,
            vec![Bytes::from_static(b"first"), Bytes::from(vec![7u8; 300])]
        );
        assert_eq!(decoder.buf.capacity(), 0, "the emptied buffer is let go");
        assert_eq!(FrameDecoder::new(0).next_message(), Ok(None));
        let mut empty = FrameDecoder::new(0);
        empty.extend(&framed(b""));
        assert_eq!(empty.next_message(), Ok(Some(Bytes::new())));
    }

    #[test]
    fn oversized_and_compressed_headers_are_refused_at_once() {
        let mut decoder = FrameDecoder::new(10);
        decoder.extend(&frame_header(11));
        assert_eq!(
            decoder.next_message(),
            Err(FrameError::TooLarge { len: 11, max: 10 })
        );
        let mut decoder = FrameDecoder::new(10);
        let mut compressed = framed(b"x");
        compressed[0] = 1;
        decoder.extend(&compressed);
        assert_eq!(decoder.next_message(), Err(FrameError::Compressed(1)));
    }

    #[test]
    fn header_is_flag_then_big_endian_length() {
        assert_eq!(frame_header(0x0102_0304), [0, 1, 2, 3, 4]);
        assert_eq!(frame_header(usize::MAX), [0, 255, 255, 255, 255]);
    }
}
