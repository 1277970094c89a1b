//! Stand-ins for Istio's Bookinfo sample apps, answering on port 9080 as the real ones do for
//! what the tests look at (the test kubelet runs them for the `examples-bookinfo-*` images):
//!
//!   bookinfo productpage v1   GET /productpage: details and reviews (3 s timeout, one retry, as
//!                             the real one), page says who answered; the `user` cookie becomes
//!                             the `end-user` header; GET /health
//!   bookinfo details v1       GET /details/ID
//!   bookinfo reviews vN       GET /reviews/ID: v1 without ratings, v2 black and v3 red stars
//!                             from ratings (10 s timeout)
//!   bookinfo ratings v1       GET /ratings/ID
//!
//! Each call forwards the trace and request headers the real apps forward. Every answer names
//! the pod (`HOSTNAME`) that gave it. On SIGTERM an app shuts down gracefully: it serves one
//! more second (while the clients' sidecars learn that its endpoint is going), then exits.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Headers the real apps copy from the request they serve to the requests they make.
const FORWARDED: &[&str] = &[
    "x-request-id",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "x-b3-flags",
    "b3",
    "traceparent",
    "tracestate",
    "x-ot-span-context",
    "end-user",
    "user-agent",
];

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            let (k, v) = (k.trim().to_string(), v.trim().to_string());
            if k.eq_ignore_ascii_case("content-length") {
                length = v.parse().unwrap_or(0);
            }
            headers.push((k, v));
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        headers,
    })
}

fn respond(mut stream: TcpStream, code: u16, content_type: &str, body: &str) {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        _ => "Error",
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
}

/// One GET to `host:port`, with `headers`; (status, body).
fn get(
    host: &str,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<(u16, String), String> {
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("resolve {host}: no address"))?;
    let mut s =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect {host}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read {host}{path}: {e}"))?;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{host}{path}: not an HTTP response"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

fn forwarded(req: &Request) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = FORWARDED
        .iter()
        .filter_map(|h| req.header(h).map(|v| (h.to_string(), v.to_string())))
        .collect();
    // productpage: the logged-in user (its session; here the `user` cookie) as `end-user`.
    if let Some(user) = req
        .header("cookie")
        .and_then(|c| c.split(';').find_map(|kv| kv.trim().strip_prefix("user=")))
        && !out.iter().any(|(k, _)| k == "end-user")
    {
        out.push(("end-user".into(), user.to_string()));
    }
    out
}

fn id_of(path: &str, prefix: &str) -> Option<String> {
    path.strip_prefix(prefix)
        .map(|id| id.split('?').next().unwrap_or(id).to_string())
}

fn handle(service: &str, version: &str, pod: &str, req: &Request) -> (u16, String) {
    if req.method != "GET" {
        return (404, "{\"error\": \"only GET\"}".into());
    }
    if req.path == "/health" {
        return (200, "{\"status\": \"healthy\"}".into());
    }
    match service {
        "details" => match id_of(&req.path, "/details/") {
            Some(id) => (
                200,
                format!(
                    "{{\"id\": {id:?}, \"author\": \"William Shakespeare\", \"year\": 1595, \"type\": \"paperback\", \
                     \"pages\": 200, \"publisher\": \"PublisherA\", \"language\": \"English\", \"podname\": {pod:?}}}"
                ),
            ),
            None => (404, "{\"error\": \"not found\"}".into()),
        },
        "ratings" => match id_of(&req.path, "/ratings/") {
            Some(id) => (
                200,
                format!(
                    "{{\"id\": {id:?}, \"ratings\": {{\"Reviewer1\": 5, \"Reviewer2\": 4}}, \"podname\": {pod:?}}}"
                ),
            ),
            None => (404, "{\"error\": \"not found\"}".into()),
        },
        "reviews" => match id_of(&req.path, "/reviews/") {
            Some(id) => {
                let ratings = match version {
                    "v1" => String::new(),
                    v => {
                        let color = if v == "v3" { "red" } else { "black" };
                        match get(
                            "ratings:9080",
                            &format!("/ratings/{id}"),
                            &forwarded(req),
                            Duration::from_secs(10),
                        ) {
                            Ok((200, body)) => format!(
                                ", \"rating\": {{\"color\": \"{color}\", \"ratings\": {body}}}"
                            ),
                            Ok((code, _)) => format!(
                                ", \"rating\": {{\"error\": \"Ratings service is currently unavailable ({code})\"}}"
                            ),
                            Err(e) => format!(
                                ", \"rating\": {{\"error\": \"Ratings service is currently unavailable: {}\"}}",
                                e.replace('"', "'")
                            ),
                        }
                    }
                };
                (
                    200,
                    format!(
                        "{{\"id\": {id:?}, \"podname\": {pod:?}, \"clustername\": \"null\", \"version\": {version:?}{ratings}}}"
                    ),
                )
            }
            None => (404, "{\"error\": \"not found\"}".into()),
        },
        "productpage" if req.path == "/productpage" || req.path.starts_with("/productpage?") => {
            let headers = forwarded(req);
            let details = match get(
                "details:9080",
                "/details/0",
                &headers,
                Duration::from_secs(3),
            ) {
                Ok((200, body)) => body,
                r => format!(
                    "Sorry, product details are currently unavailable for this book. ({r:?})"
                ),
            };
            // As the real productpage: a 3 s timeout and one retry.
            let mut reviews = String::new();
            for _ in 0..2 {
                match get(
                    "reviews:9080",
                    "/reviews/0",
                    &headers,
                    Duration::from_secs(3),
                ) {
                    Ok((200, body)) => {
                        reviews = body;
                        break;
                    }
                    r => {
                        reviews = format!(
                            "Sorry, product reviews are currently unavailable for this book. ({r:?})"
                        )
                    }
                }
            }
            let user = headers
                .iter()
                .find(|(k, _)| k == "end-user")
                .map(|(_, v)| v.as_str())
                .unwrap_or("");
            (
                200,
                format!(
                    "<html><body><h3>The Comedy of Errors</h3>\n<div id=\"user\">{user}</div>\n\
                     <div id=\"details\">{details}</div>\n<div id=\"reviews\">{reviews}</div>\n\
                     <div id=\"podname\">{pod}</div></body></html>\n"
                ),
            )
        }
        "productpage" if req.path == "/" => (200, "<html><body>Bookinfo</body></html>".into()),
        _ => (404, "{\"error\": \"not found\"}".into()),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(service), Some(version)) = (args.get(1).cloned(), args.get(2).cloned()) else {
        eprintln!("usage: bookinfo productpage|details|reviews|ratings VERSION");
        std::process::exit(2);
    };
    if !["productpage", "details", "reviews", "ratings"].contains(&service.as_str()) {
        eprintln!(
            "bookinfo: unknown service {service:?} (productpage, details, reviews or ratings)"
        );
        std::process::exit(2);
    }
    let pod = std::env::var("HOSTNAME").unwrap_or_else(|_| format!("{service}-{version}"));
    let listener = match TcpListener::bind("0.0.0.0:9080") {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bookinfo {service} {version}: listen on 0.0.0.0:9080: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("bookinfo {service} {version} ({pod}) listening on 0.0.0.0:9080");
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            if let Ok(mut term) = signal(SignalKind::terminate()) {
                term.recv().await;
                eprintln!("SIGTERM: serving one more second");
                tokio::time::sleep(Duration::from_secs(1)).await;
                std::process::exit(0);
            }
        });
    });
    for stream in listener.incoming().flatten() {
        let (service, version, pod) = (service.clone(), version.clone(), pod.clone());
        std::thread::spawn(move || {
            let Some(req) = read_request(&stream) else {
                return;
            };
            let (code, body) = handle(&service, &version, &pod, &req);
            eprintln!("{} {} -> {code}", req.method, req.path);
            let ct = if service == "productpage" {
                "text/html"
            } else {
                "application/json"
            };
            respond(stream, code, ct, &body);
        });
    }
}
