//! Helpers the end-to-end tests share: the binary under test and loopback ports.

use std::process::Command;
use std::time::{Duration, Instant};

/// The `meridian` binary this test run built.
pub fn meridian() -> Command {
    Command::new(env!("CARGO_BIN_EXE_meridian"))
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    // Below Linux's ephemeral range (32768 and up by default): a port the kernel hands out for
    // `:0` can be handed out again, as the source port of an outgoing connection (a server
    // dialling its peers), before the process it was picked for binds it.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let base = 20_000 + (std::process::id() % 600) * 20;
    for _ in 0..12_000 {
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 12_000;
        let port = u16::try_from(20_000 + (base - 20_000 + offset) % 12_000).expect("below 32000");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000");
}

/// Waits (up to 30 s) until something accepts connections on `port`.
pub fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The raw response to `GET path` from the HTTP listener at `addr` (a node's metrics).
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("metrics listen");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The committed count on a benchmark's `window` line.
pub fn committed_in(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("window ").and_then(|rest| rest.split(", ").nth(1)))
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a window line")
}
