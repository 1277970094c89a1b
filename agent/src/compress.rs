//! gzip and zstd on the status port's answers, as Istio's agent compresses them since 1.30
//! (klauspost's `gzhttp` around its whole mux): the encoding the client's `Accept-Encoding`
//! weighs highest, zstd on a tie; bodies under 1 KiB as they are; `Vary: Accept-Encoding` on
//! every answer that could be compressed. gzip streams (the merged metrics are never held
//! whole); zstd (pure Rust, no streaming encoder) compresses the whole body at its fastest level.

use std::convert::Infallible;
use std::io::Write;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::Response;
use hyper::body::Body as _;
use hyper::header::{CONTENT_ENCODING, CONTENT_LENGTH, HeaderValue, VARY};
use tokio_stream::StreamExt;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// Bodies smaller than this go out as they are (gzhttp's `DefaultMinSize`).
pub const MIN_SIZE: u64 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Gzip,
    Zstd,
}

impl Encoding {
    fn name(self) -> &'static str {
        match self {
            Encoding::Gzip => "gzip",
            Encoding::Zstd => "zstd",
        }
    }
}

/// The encoding `accept` (an `Accept-Encoding` value) weighs highest among gzip and zstd, zstd
/// on a tie; none when it names neither or gives both q=0.
pub fn negotiate(accept: Option<&str>) -> Option<Encoding> {
    let mut best: Option<(f32, Encoding)> = None;
    for item in accept?.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .filter_map(|q| q.trim().parse::<f32>().ok())
            .next()
            .unwrap_or(1.0);
        let encoding = match name.as_str() {
            "gzip" => Encoding::Gzip,
            "zstd" => Encoding::Zstd,
            _ => continue,
        };
        if q <= 0.0 {
            continue;
        }
        let better = match best {
            None => true,
            Some((bq, be)) => q > bq || (q == bq && encoding == Encoding::Zstd && be != encoding),
        };
        if better {
            best = Some((q, encoding));
        }
    }
    best.map(|(_, e)| e)
}

/// `resp` encoded as `encoding` (when there is one, and the body is not known to be small).
pub fn apply(mut resp: Response<Body>, encoding: Option<Encoding>) -> Response<Body> {
    let small = resp
        .body()
        .size_hint()
        .upper()
        .is_some_and(|n| n < MIN_SIZE);
    let already = resp.headers().contains_key(CONTENT_ENCODING);
    if already {
        return resp;
    }
    resp.headers_mut()
        .append(VARY, HeaderValue::from_static("Accept-Encoding"));
    let Some(encoding) = encoding.filter(|_| !small) else {
        return resp;
    };
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_ENCODING, HeaderValue::from_static(encoding.name()));
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    tokio::spawn(encode(body, encoding, tx));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(|b| Ok::<_, Infallible>(hyper::body::Frame::data(b)));
    Response::from_parts(parts, BodyExt::boxed(StreamBody::new(stream)))
}

/// Reads `body` and sends it on encoded; a closed receiver (the client went away) ends it.
async fn encode(mut body: Body, encoding: Encoding, tx: tokio::sync::mpsc::Sender<Bytes>) {
    match encoding {
        Encoding::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if gz.write_all(&data).is_err() {
                    return;
                }
                let out = std::mem::take(gz.get_mut());
                if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                    return;
                }
            }
            if let Ok(rest) = gz.finish() {
                let _ = tx.send(Bytes::from(rest)).await;
            }
        }
        Encoding::Zstd => {
            let mut whole = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    whole.extend_from_slice(&data);
                }
            }
            let out = ruzstd::encoding::compress_to_vec(
                whole.as_slice(),
                ruzstd::encoding::CompressionLevel::Fastest,
            );
            let _ = tx.send(Bytes::from(out)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use std::io::Read;

    #[test]
    fn negotiation_is_gzhttps() {
        for (accept, want) in [
            (Some("gzip, zstd"), Some(Encoding::Zstd)),
            (Some("gzip;q=1.0, zstd;q=0.5"), Some(Encoding::Gzip)),
            (Some("br, lz4"), None),
            (Some("gzip"), Some(Encoding::Gzip)),
            (Some("zstd;q=0, gzip;q=0.1"), Some(Encoding::Gzip)),
            (Some("GZIP"), Some(Encoding::Gzip)),
            (None, None),
        ] {
            assert_eq!(negotiate(accept), want, "{accept:?}");
        }
    }

    async fn body_of(resp: Response<Body>) -> Vec<u8> {
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[tokio::test]
    async fn large_bodies_are_compressed_small_ones_not() {
        let text = "istio_agent_scrapes_total 1\n".repeat(200);
        let resp = |t: &str| Response::new(Full::new(Bytes::from(t.to_string())).boxed());

        let gz = apply(resp(&text), Some(Encoding::Gzip));
        assert_eq!(gz.headers()[CONTENT_ENCODING], "gzip");
        assert_eq!(gz.headers()[VARY], "Accept-Encoding");
        let mut plain = String::new();
        flate2::read::GzDecoder::new(body_of(gz).await.as_slice())
            .read_to_string(&mut plain)
            .unwrap();
        assert_eq!(plain, text);

        let zs = apply(resp(&text), Some(Encoding::Zstd));
        assert_eq!(zs.headers()[CONTENT_ENCODING], "zstd");
        let bytes = body_of(zs).await;
        assert!(bytes.len() < text.len() / 4, "{} bytes", bytes.len());
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(bytes.as_slice()).unwrap();
        let mut plain = String::new();
        decoder.read_to_string(&mut plain).unwrap();
        assert_eq!(plain, text);

        let small = apply(resp("ok\n"), Some(Encoding::Gzip));
        assert!(!small.headers().contains_key(CONTENT_ENCODING));
        assert_eq!(small.headers()[VARY], "Accept-Encoding");
        assert_eq!(body_of(small).await, b"ok\n");
    }
}
