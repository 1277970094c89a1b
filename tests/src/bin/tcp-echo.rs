//! A stand-in for Istio's `tcp-echo` sample server (`samples/tcp-echo`, image
//! `tcp-echo-server`), which the test kubelet runs for that image: `tcp-echo PORTS PREFIX`
//! listens on each of the comma-separated PORTS and answers every line a client sends with
//! `PREFIX LINE`, as the real one does, until the client closes.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};

fn serve(conn: TcpStream, prefix: &str) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut answer = format!("{prefix} ").into_bytes();
        answer.extend_from_slice(&line);
        if out.write_all(&answer).is_err() {
            return;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [ports, prefix] = args.as_slice() else {
        eprintln!("usage: tcp-echo PORT[,PORT...] PREFIX");
        std::process::exit(1);
    };
    let mut threads = Vec::new();
    for port in ports.split(',') {
        let listener = match port
            .parse::<u16>()
            .map(|p| TcpListener::bind(("0.0.0.0", p)))
        {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                eprintln!("tcp-echo: cannot listen on port {port}: {e}");
                std::process::exit(1);
            }
            Err(_) => {
                eprintln!("tcp-echo: {port:?} is not a port");
                std::process::exit(1);
            }
        };
        println!("listening on {port}, prefix: {prefix}");
        let prefix = prefix.clone();
        threads.push(std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let prefix = prefix.clone();
                std::thread::spawn(move || serve(conn, &prefix));
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
}
